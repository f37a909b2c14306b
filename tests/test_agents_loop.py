"""The agent loop against the real openai / anthropic SDKs and a scripted local server.

Each scenario asserts what the NEXT prompt the server received contains.
"""
from __future__ import annotations

import json
import time

import pytest

from agents_support import BROKEN, COUNTEREXAMPLE, DIAGNOSTIC, ScriptedEvaluator, answer, make_task
from fake_llm_server import FakeLLMServer
from specgen.agents.anthropic import AnthropicAgent
from specgen.agents.loop import Budget, run_loop
from specgen.agents.openai import OpenAIAgent, OpenAICompatibleAgent
from specgen.agents.registry import AgentOptions
from specgen.agents.replay import ReplayAgent
from specgen.agents.transcript import Transcript
from specgen.errors import EnvironmentMissing, UsageError

SECRET = "sk-test-SECRET-0123456789abcdefXYZ"


@pytest.fixture
def server():
    with FakeLLMServer() as fake:
        yield fake


@pytest.fixture
def task(tmp_path):
    return make_task(tmp_path)


def openai_agent(server, monkeypatch, sleeps=None, **options):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    settings = dict(base_url=server.openai_base_url, timeout_s=5, max_retries=2, backoff_s=0.01)
    settings.update(options)
    return OpenAIAgent(AgentOptions(**settings), sleep=(sleeps.append if sleeps is not None else time.sleep))


def test_compile_error_is_fixed_on_the_next_attempt(server, task, monkeypatch):
    server.push(f"Here you go:\n```cuda\n{BROKEN}```", answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                      Budget(attempts=4, target_roofline=0.9))
    assert [a.stage for a in result.attempts] == ["compile", "done"]
    assert DIAGNOSTIC in server.last_user_message(1)
    assert "nvcc failed to compile" in server.last_user_message(1)
    assert "// FAST" in result.winner.source
    assert result.stopped.startswith("target reached")
    assert len(server.requests) == 2


def test_wrong_result_is_fixed_and_prompt_carries_the_counterexample(server, task, monkeypatch):
    server.push(answer("WRONG"), answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                      Budget(attempts=4, target_roofline=0.9))
    prompt = server.last_user_message(1)
    assert "FAILED verification" in prompt
    for key in ("shape", "dtype", "seed", "max_abs_error", "where"):
        assert f"{key}: {COUNTEREXAMPLE[key]}" in prompt
    # The wrong kernel is shown back to the model as the assistant turn it is to fix.
    assert "// WRONG" in server.requests[1]["body"]["messages"][-2]["content"]
    assert "// FAST" in result.winner.source


def test_slow_kernel_is_improved_and_prompt_carries_the_timings(server, task, monkeypatch):
    server.push(answer("SLOW"), answer("MEDIUM"), answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                      Budget(attempts=5, target_roofline=0.9))
    second, third = server.last_user_message(1), server.last_user_message(2)
    assert "kernel 500.0 us" in second and "eager PyTorch 200.0 us (kernel 2.50x SLOWER)" in second
    assert "SLOWER than eager PyTorch, so it cannot be used" in second
    assert "kernel 150.0 us" in third and "torch.compile 150.0 us" in third
    assert "42% of the memory roofline" in third and "Target: 90%" in third
    assert "// FAST" in result.winner.source
    assert [a.stage for a in result.attempts] == ["done"] * 3


def test_a_correct_kernel_slower_than_eager_never_wins(server, task, monkeypatch):
    server.push(answer("SLOW"), answer("SLOW"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(), Budget(attempts=2))
    assert result.winner is None
    assert result.stopped == "all 2 attempts used"
    assert any("reference path" in note for note in result.notes)


def test_an_answer_without_code_gets_a_retry_message(server, task, monkeypatch):
    server.push("I am sorry, I cannot help with CUDA today.", answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                      Budget(attempts=3, target_roofline=0.9))
    assert result.attempts[0].stage == "extract" and result.attempts[0].candidate is None
    prompt = server.last_user_message(1)
    assert "no code block" in prompt and "`scale_add_forward`" in prompt
    assert "I am sorry" in server.requests[1]["body"]["messages"][-2]["content"]
    assert "// FAST" in result.winner.source


def test_a_truncated_answer_asks_for_the_complete_file(server, task, monkeypatch):
    cut = answer("FAST")[:-60]
    server.push({"text": cut, "truncated": True}, answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                      Budget(attempts=3, target_roofline=0.9))
    assert "cut off" in server.last_user_message(1)
    assert result.winner is not None


def test_429_then_success_honours_retry_after(server, task, monkeypatch):
    sleeps: list[float] = []
    server.push({"status": 429, "retry_after": 0.25}, {"status": 503}, answer("FAST"))
    agent = openai_agent(server, monkeypatch, sleeps=sleeps, max_retries=3, backoff_s=0.01)
    result = run_loop(task, agent, ScriptedEvaluator(), Budget(attempts=1))
    assert len(server.requests) == 3
    assert sleeps[0] == 0.25  # the server's retry-after
    assert 0.01 <= sleeps[1] <= 0.0125 * 2  # exponential backoff, second step
    assert result.winner is not None and result.winner.log["retries"] == 2


def test_retries_are_bounded(server, task, monkeypatch):
    server.push({"status": 500}, {"status": 500}, {"status": 500})
    agent = openai_agent(server, monkeypatch, sleeps=[], max_retries=2)
    with pytest.raises(EnvironmentMissing, match="no usable answer after 3 tries"):
        run_loop(task, agent, ScriptedEvaluator(), Budget(attempts=1))


def test_a_hanging_server_times_out_with_a_clear_error(server, task, monkeypatch):
    server.push({"hang": 3})
    agent = openai_agent(server, monkeypatch, timeout_s=0.5, max_retries=0)
    started = time.monotonic()
    with pytest.raises(EnvironmentMissing, match=r"APITimeoutError.*--timeout \(now 0.5 s\)"):
        run_loop(task, agent, ScriptedEvaluator(), Budget(attempts=1))
    assert time.monotonic() - started < 2.5


def test_a_timeout_then_success(server, task, monkeypatch):
    server.push({"hang": 2}, answer("FAST"))
    agent = openai_agent(server, monkeypatch, sleeps=[], timeout_s=0.5, max_retries=1)
    result = run_loop(task, agent, ScriptedEvaluator(), Budget(attempts=1))
    assert result.winner is not None


def test_malformed_json_is_retried(server, task, monkeypatch):
    server.push({"malformed": True}, answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch, sleeps=[]), ScriptedEvaluator(),
                      Budget(attempts=1))
    assert result.winner is not None and len(server.requests) == 2


def test_a_rejected_key_names_the_variable(server, task, monkeypatch):
    server.push({"status": 401})
    with pytest.raises(EnvironmentMissing, match="rejected the API key.*OPENAI_API_KEY"):
        run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(), Budget(attempts=1))


def test_missing_keys_name_the_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(EnvironmentMissing, match="OPENAI_API_KEY"):
        OpenAIAgent(AgentOptions())
    with pytest.raises(EnvironmentMissing, match="ANTHROPIC_API_KEY"):
        AnthropicAgent(AgentOptions())
    with pytest.raises(EnvironmentMissing, match="MY_KEY"):
        OpenAIAgent(AgentOptions(api_key_env="MY_KEY"))


def test_a_missing_sdk_names_the_extra(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setitem(__import__("sys").modules, "anthropic", None)
    with pytest.raises(EnvironmentMissing, match=r"pip install 'specgen\[anthropic\]'"):
        AnthropicAgent(AgentOptions())


def test_anthropic_compile_error_fixed(server, task, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    server.push({"status": 529}, f"```cuda\n{BROKEN}```", answer("FAST"))  # 529: overloaded, retried
    agent = AnthropicAgent(AgentOptions(base_url=server.anthropic_base_url, timeout_s=5, backoff_s=0.01))
    result = run_loop(task, agent, ScriptedEvaluator(), Budget(attempts=3, target_roofline=0.9))
    assert [r["path"] for r in server.requests] == ["/v1/messages"] * 3
    body = server.requests[2]["body"]
    assert "Define the entry points with C linkage" in body["system"]
    assert body["model"] == "claude-sonnet-4-6" and body["max_tokens"] > 0
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert DIAGNOSTIC in server.last_user_message(2)
    assert result.winner.agent == "anthropic"
    # Tokens and cost are counted from the answers' usage and the price table.
    assert result.usage.input_tokens > 0 and result.usage.cost_usd > 0


def test_openai_compatible_with_base_url(server, task, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # must NOT be sent to a third-party server
    server.push(answer("FAST"))
    agent = OpenAICompatibleAgent(AgentOptions(base_url=server.openai_base_url, model="qwen-coder",
                                               timeout_s=5))
    result = run_loop(task, agent, ScriptedEvaluator(), Budget(attempts=1))
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "qwen-coder" and "max_tokens" in request["body"]
    assert SECRET not in json.dumps(request["headers"])
    assert result.winner.agent == "openai-compatible" and result.usage.cost_usd == 0.0


def test_openai_compatible_sends_the_key_named_by_api_key_env(server, monkeypatch, task):
    monkeypatch.setenv("VLLM_KEY", "vllm-secret-123456")
    server.push(answer("FAST"))
    agent = OpenAICompatibleAgent(AgentOptions(base_url=server.openai_base_url, model="m",
                                               api_key_env="VLLM_KEY"))
    run_loop(task, agent, ScriptedEvaluator(), Budget(attempts=1))
    assert server.requests[0]["headers"]["authorization"] == "Bearer vllm-secret-123456"


def test_openai_compatible_needs_a_base_url():
    with pytest.raises(UsageError, match="--base-url"):
        OpenAICompatibleAgent(AgentOptions(model="m"))


def test_parallel_samples_share_a_round(server, task, monkeypatch):
    server.push(f"```cuda\n{BROKEN}```", answer("WRONG"), answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                      Budget(attempts=3, samples=3))
    assert len(server.requests) == 3 and len(result.attempts) == 3
    assert sorted(a.stage for a in result.attempts) == ["compile", "done", "verify"]
    assert "// FAST" in result.winner.source


def test_cost_budget_stops_the_loop(server, task, monkeypatch):
    server.push(answer("SLOW"), answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                      Budget(attempts=5, cost_usd=1e-9))
    assert len(server.requests) == 1 and result.stopped.startswith("cost budget")


def test_wall_time_stops_the_loop(server, task, monkeypatch):
    server.push(answer("SLOW"), answer("FAST"))
    ticks = iter([0.0, 0.0, 100.0, 100.0])
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                      Budget(attempts=5, wall_time_s=10), clock=lambda: next(ticks))
    assert len(server.requests) == 1 and result.stopped.startswith("wall time")


def test_without_a_gpu_the_loop_stops_at_the_first_compiled_candidate(server, task, monkeypatch):
    server.push(f"```cuda\n{BROKEN}```", answer("FAST"), answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(can_verify=False),
                      Budget(attempts=5))
    assert len(server.requests) == 2
    assert result.winner is None and "// FAST" in result.compiled.source
    assert not result.verified and "needs a GPU" in result.stopped


def test_transcript_records_everything_but_the_key_and_replays_offline(tmp_path, task, monkeypatch):
    path = tmp_path / "t.jsonl"
    with FakeLLMServer([f"```cuda\n{BROKEN}```", "no code, sorry", answer("WRONG"), answer("FAST")]) as server:
        result = run_loop(task, openai_agent(server, monkeypatch), ScriptedEvaluator(),
                          Budget(attempts=6, target_roofline=0.9), Transcript(path))
        assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    text = path.read_text()
    assert SECRET not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["type"] for r in records] == ["start"] + ["attempt"] * 4 + ["end"]
    attempts = records[1:5]
    assert attempts[0]["details"]["diagnostics"].endswith(DIAGNOSTIC)
    assert attempts[2]["details"]["counterexample"]["shape"] == "N=4097"
    assert attempts[3]["details"]["timings"]["kernel_us"] == 80.0
    assert attempts[0]["messages"][0]["role"] == "system" and attempts[0]["response"]
    assert attempts[0]["usage"]["input_tokens"] > 0
    assert records[-1]["winner"] == 4

    # The server is gone: replay needs no network and reruns the same sources in order.
    evaluator = ScriptedEvaluator()
    replayed = run_loop(task, ReplayAgent(path), evaluator, Budget(attempts=10))
    assert [a.stage for a in replayed.attempts] == [a.stage for a in result.attempts]
    assert evaluator.compiled == [a.candidate.source for a in result.attempts if a.candidate]
    assert replayed.winner.source == result.winner.source and replayed.winner.agent == "openai"
    assert "replayed" in replayed.stopped


def test_a_provider_failing_mid_run_keeps_the_winner_found_so_far(server, task, monkeypatch):
    server.push(answer("FAST"), {"status": 500}, {"status": 500}, {"status": 500})
    agent = openai_agent(server, monkeypatch, sleeps=[], max_retries=2)
    result = run_loop(task, agent, ScriptedEvaluator(), Budget(attempts=4))
    assert "// FAST" in result.winner.source
    assert result.stopped.startswith("the agent failed") and "after 3 tries" in result.stopped


class _TimedEvaluator(ScriptedEvaluator):
    """Every candidate correct; kernel time from the marker, eager fixed at 577 us."""

    def measure(self, candidate, library):
        kernel_us = {"TIE": 579.1, "LOSS": 577.0 / 0.96}[next(m for m in ("TIE", "LOSS") if m in candidate.source)]
        return {"kernel_us": kernel_us, "eager_us": 577.0, "compile_us": 666.5, "roofline_fraction": 0.9}


def test_a_kernel_within_the_noise_of_eager_is_not_slower_and_wins(server, task, monkeypatch):
    from specgen.agents.loop import EAGER_NOISE_RATIO

    assert EAGER_NOISE_RATIO == 0.97
    server.push(answer("TIE"))
    result = run_loop(task, openai_agent(server, monkeypatch), _TimedEvaluator(), Budget(attempts=1))
    assert result.attempts[0].details["slower_than_eager"] is False
    assert result.winner is not None and "// TIE" in result.winner.source


def test_a_kernel_beyond_the_noise_margin_is_slower_and_loses(server, task, monkeypatch):
    server.push(answer("LOSS"))
    result = run_loop(task, openai_agent(server, monkeypatch), _TimedEvaluator(), Budget(attempts=1))
    assert result.attempts[0].details["slower_than_eager"] is True
    assert result.winner is None


class _RowsEvaluator(ScriptedEvaluator):
    """Every candidate correct and faster than eager in total, but slower on the decode row."""

    def measure(self, candidate, library):
        row = {"direction": "forward", "dtype": "float32"}
        rows = [{**row, "dims": {"N": 8192}, "kernel_us": 100.0, "eager_us": 300.0},
                {**row, "dims": {"N": 8}, "kernel_us": 9.0, "eager_us": 6.0}]
        return {"kernel_us": 109.0, "eager_us": 306.0, "per_shape": rows}


def test_a_kernel_slower_than_eager_on_one_row_loses_even_when_faster_in_total(server, task, monkeypatch):
    server.push(answer("FAST"))
    result = run_loop(task, openai_agent(server, monkeypatch), _RowsEvaluator(), Budget(attempts=1))
    details = result.attempts[0].details
    assert details["slower_than_eager"] is True and details["slower_rows"][0]["dims"] == {"N": 8}
    assert result.winner is None and any("reference path" in note for note in result.notes)
