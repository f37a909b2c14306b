"""`specgen draft`: the real OpenAI and Anthropic SDKs against the local fake server; a draft
that fails `specgen check` goes back with its error, the fixed one is written for review."""
from __future__ import annotations

import json

import pytest

from fake_llm_server import FakeLLMServer
from specgen.cli import main
from specgen.drafting import extract_spec

GOOD = '''\
name: silu_scale
description: SiLU of x times a learned per-column scale.
signature: "silu_scale(x: Tensor[N, D], scale: Tensor[D]) -> Tensor[N, D]"
dtypes: [float32, bfloat16]
dims: {N: [1, 65536], D: [1, 8192]}
reference: |
  import torch.nn.functional as F

  def reference(x, scale):
      return F.silu(x * scale)
backward: kernel
benchmark:
  - {N: 16384, D: 4096}
  - {N: 64, D: 4096}
'''
# The first draft forgets D's range: `specgen check` says so, and the model fixes it.
NO_RANGE = GOOD.replace("dims: {N: [1, 65536], D: [1, 8192]}", "dims: {N: [1, 65536]}")
# A reference returning the wrong shape: check runs it and says what the signature wanted.
WRONG_SHAPE = GOOD.replace("return F.silu(x * scale)", "return F.silu(x * scale).sum(-1)")


def answer(yaml_text: str) -> str:
    return f"Here is the spec.\n\n```yaml\n{yaml_text}```\n"


def draft(*argv) -> int:
    return main(["draft", *map(str, argv)])


@pytest.fixture(autouse=True)
def _transcripts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # transcripts go under tmp_path/.specgen


@pytest.mark.parametrize("agent", ["openai", "anthropic"])
def test_a_draft_that_fails_check_goes_back_and_the_fixed_one_is_written(agent, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key-0000")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key")
    out = tmp_path / "specs" / "silu_scale.yaml"
    with FakeLLMServer([answer(NO_RANGE), answer(GOOD)]) as server:
        base = server.openai_base_url if agent == "openai" else server.anthropic_base_url
        code = draft("SiLU of x times a learned per-column scale", "--agent", agent, "--base-url", base,
                     "--model", "fake-model", "-o", out)
        assert code == 0, capsys.readouterr().err
        assert len(server.requests) == 2
        first, feedback = server.prompt_text(0), server.last_user_message(1)
        assert server.requests[0]["path"].endswith("/chat/completions" if agent == "openai" else "/messages")
    assert "SiLU of x times a learned per-column scale" in first and "Name the op `silu_scale`" in first
    assert "no range given for dimension(s) D" in feedback and "```yaml" in feedback
    text = out.read_text()
    assert text.startswith("# Drafted by `specgen draft`") and text.endswith(GOOD)
    assert main(["check", str(out)]) == 0
    transcripts = list((tmp_path / ".specgen" / "transcripts").glob("draft-silu_scale-*.jsonl"))
    records = [json.loads(line) for line in transcripts[0].read_text().splitlines()]
    assert [r["type"] for r in records] == ["start", "attempt", "attempt", "end"]
    assert "sk-test-not-a-real-key" not in transcripts[0].read_text()


def test_the_reference_is_run_and_a_wrong_shape_goes_back(tmp_path, capsys):
    out = tmp_path / "silu_scale.yaml"
    with FakeLLMServer(["Sure, here is some prose and no spec.", answer(WRONG_SHAPE), answer(GOOD)]) as server:
        code = draft("SiLU times scale", "--agent", "openai-compatible", "--base-url", server.openai_base_url,
                     "--model", "local", "-o", out, "--json", "-")
        feedbacks = [server.last_user_message(i) for i in (1, 2)]
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "has no spec" in feedbacks[0]
    assert "output 'out' has shape" in feedbacks[1]
    data = json.loads(captured.out)
    assert data["passed"] and data["path"] == str(out) and len(data["attempts"]) == 3
    assert [a["problem"] is None for a in data["attempts"]] == [False, False, True]


def test_attempts_are_bounded_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "silu_scale.yaml"
    with FakeLLMServer([answer(NO_RANGE)] * 3) as server:
        code = draft("SiLU times scale", "--agent", "openai-compatible", "--base-url", server.openai_base_url,
                     "--model", "local", "-o", out, "--attempts", "2")
        assert len(server.requests) == 2
    assert code == 1
    assert "no draft passed `specgen check` in 2 attempt(s)" in capsys.readouterr().err
    assert not out.exists()


def test_a_folder_takes_the_agents_name_and_never_overwrites(tmp_path, capsys):
    folder = tmp_path / "specs"
    (folder).mkdir()
    (folder / "silu_scale.yaml").write_text("# mine\n")
    with FakeLLMServer([answer(GOOD), answer(GOOD)]) as server:
        args = ["SiLU times scale", "--agent", "openai-compatible", "--base-url", server.openai_base_url,
                "--model", "local", "-o", folder]
        assert draft(*args) == 2
        assert "--force" in capsys.readouterr().err
        assert (folder / "silu_scale.yaml").read_text() == "# mine\n"
        assert draft(*args, "--force") == 0
    assert (folder / "silu_scale.yaml").read_text().endswith(GOOD)


def test_an_existing_file_is_refused_before_any_request(tmp_path, capsys):
    out = tmp_path / "silu_scale.yaml"
    out.write_text("# mine\n")
    with FakeLLMServer([answer(GOOD)]) as server:
        assert draft("x", "--agent", "openai-compatible", "--base-url", server.openai_base_url, "--model", "m",
                     "-o", out) == 2
        assert server.requests == []


def test_offline_it_says_it_needs_an_llm_agent(tmp_path, capsys):
    assert draft("RMSNorm with a learned scale", "-o", tmp_path / "rms.yaml") == 3
    err = capsys.readouterr().err
    assert "needs an LLM agent" in err and "openai" in err
    assert draft("RMSNorm", "--agent", "builtin", "-o", tmp_path / "rms.yaml") == 3


def test_missing_key_is_an_environment_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert draft("RMSNorm", "--agent", "openai", "-o", tmp_path / "rms.yaml") == 3
    assert "OPENAI_API_KEY" in capsys.readouterr().err


def test_spec_extraction():
    assert extract_spec(answer(GOOD)) == GOOD
    assert extract_spec("```python\nprint(1)\n```\n```yaml\n" + GOOD + "```") == GOOD
    assert extract_spec(GOOD) == GOOD  # a bare spec
    assert extract_spec("no spec here") is None
