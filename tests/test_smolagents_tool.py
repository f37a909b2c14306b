"""The agent-framework tool: kernel_feedback's answers, and the real smolagents Tool driven by a
real smolagents CodeAgent whose model is the local fake server."""
from __future__ import annotations

import pytest

from conftest import REPO, SPECS
from fake_llm_server import FakeLLMServer
from specgen.smolagents_tool import TOOL_NAME, kernel_feedback, specgen_tool

GOOD = REPO / "tests" / "kernels" / "gelu_tanh.cu"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.nvcc
def test_check_compiles_the_kernel_against_the_spec():
    answer = kernel_feedback(str(SPECS / "gelu_tanh.yaml"), str(GOOD), "check")
    assert answer["ok"] and answer["exit_code"] == 0 and answer["op"] == "gelu_tanh"


@pytest.mark.nvcc
def test_a_compile_error_comes_back_with_the_diagnostics():
    broken = GOOD.read_text().replace("return", "retrun", 1)
    answer = kernel_feedback((SPECS / "gelu_tanh.yaml").read_text(), broken, "check")
    assert not answer["ok"] and answer["exit_code"] == 1 and answer["stage"] == "compile"
    assert "error" in answer["diagnostics"] and "retrun" in answer["diagnostics"]


@pytest.mark.nvcc
def test_verify_without_a_gpu_says_so(monkeypatch):
    monkeypatch.setattr("specgen.lock.gpu_available", lambda: False)
    answer = kernel_feedback(str(SPECS / "gelu_tanh.yaml"), GOOD.read_text(), "verify")
    assert not answer["ok"] and answer["exit_code"] == 3 and "needs a CUDA GPU" in answer["reason"]


def test_a_bad_spec_or_action_is_data_not_an_exception():
    answer = kernel_feedback("name: x\nsignature: nope\n", "// no kernel", "check")
    assert not answer["ok"] and answer["exit_code"] == 2 and answer["stage"] == "spec"
    assert kernel_feedback("", "", "lint")["exit_code"] == 2


@pytest.mark.gpu
def test_bench_on_a_gpu_returns_timings():
    answer = kernel_feedback(str(SPECS / "gelu_tanh.yaml"), str(GOOD), "bench")
    assert answer["ok"], answer
    assert answer["timings"]["kernel_us"] > 0 and answer["timings"]["per_shape"]


@pytest.mark.nvcc
def test_a_real_smolagents_code_agent_calls_the_tool():
    smolagents = pytest.importorskip("smolagents")
    tool = specgen_tool()
    assert isinstance(tool, smolagents.Tool) and tool.name == TOOL_NAME
    step = (f'Thought: check my kernel with specgen.\n<code>\nresult = {TOOL_NAME}(spec="{SPECS / "gelu_tanh.yaml"}", '
            f'kernel="{GOOD}", action="check")\nfinal_answer(result)\n</code>')
    with FakeLLMServer([step]) as server:
        model = smolagents.OpenAIServerModel(model_id="fake", api_base=server.openai_base_url, api_key="x")
        agent = smolagents.CodeAgent(tools=[tool], model=model, max_steps=2, verbosity_level=0)
        result = agent.run("Write a GELU kernel and check it with specgen")
        assert TOOL_NAME in server.prompt_text(0)  # the agent was told about the tool
    assert result["ok"] and result["op"] == "gelu_tanh" and result["exit_code"] == 0


def test_without_smolagents_the_tool_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_smolagents(name, *args, **kwargs):
        if name == "smolagents":
            raise ModuleNotFoundError("No module named 'smolagents'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_smolagents)
    from specgen.errors import EnvironmentMissing

    with pytest.raises(EnvironmentMissing, match=r"specgen\[smolagents\]"):
        specgen_tool()
