"""`specgen generate` end to end on this machine: the real SDK, the real nvcc, the lock."""
from __future__ import annotations

import json

import pytest

from agents_support import BROKEN, SPEC_YAML, answer
from fake_llm_server import FakeLLMServer
from specgen import cli


@pytest.fixture
def spec_file(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    path = folder / "scale_add.yaml"
    path.write_text(SPEC_YAML)
    return path


@pytest.mark.nvcc
def test_generate_feeds_real_nvcc_diagnostics_back_and_locks_the_kernel(tmp_path, spec_file, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("specgen.lock.gpu_available", lambda: False)  # compile feedback only
    with FakeLLMServer([f"```cuda\n{BROKEN}```", answer("FAST")]) as server:
        code = cli.main(["generate", str(spec_file), "--agent", "openai-compatible",
                         "--base-url", server.openai_base_url, "--model", "local-coder",
                         "--attempts", "4", "--transcript-dir", str(tmp_path / "transcripts")])
        assert code == 1  # written, but no verified kernel: generate says so in its exit code
        assert len(server.requests) == 2
        feedback = server.last_user_message(1)
    assert "nvcc failed to compile" in feedback
    assert "scale_add.cu:6: error" in feedback and "flaot" in feedback  # the source line too
    kernel = spec_file.parent / "kernels" / "scale_add.cu"
    assert "// FAST" in kernel.read_text()
    entry = json.loads((spec_file.parent / "specgen.lock").read_text())["ops"]["scale_add"]
    assert entry["agent"] == "openai-compatible" and entry["model"] == "local-coder"
    assert entry["records"] == []  # no GPU: no verification record
    transcripts = list((tmp_path / "transcripts").glob("scale_add-*.jsonl"))
    assert len(transcripts) == 1


def test_unknown_agent_is_a_usage_error(spec_file, capsys):
    assert cli.main(["generate", str(spec_file), "--agent", "gpt"]) == 2
    assert "choose one of" in capsys.readouterr().err


def test_missing_key_exits_3_naming_the_variable(spec_file, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert cli.main(["generate", str(spec_file), "--agent", "openai"]) == 3
    assert "OPENAI_API_KEY" in capsys.readouterr().err


def test_replay_needs_a_transcript(spec_file, capsys):
    assert cli.main(["generate", str(spec_file), "--agent", "replay"]) == 2
    assert "--transcript" in capsys.readouterr().err


def test_openai_compatible_needs_base_url(spec_file, capsys):
    assert cli.main(["generate", str(spec_file), "--agent", "openai-compatible", "--model", "m"]) == 2
    assert "--base-url" in capsys.readouterr().err
