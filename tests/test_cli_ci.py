"""A CLI that reads well in CI: stage lines with elapsed time off a terminal, `--json -` alone on
stdout, `--version`, whole op names in tables, and `generate` exiting 1 when a spec ends with
no verified kernel."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from agents_support import SPEC_YAML, ScriptedEvaluator, answer
from conftest import REPO, SPECS
from fake_llm_server import FakeLLMServer
from specgen import __version__
from specgen.cli import main

LONG = "a_rather_long_operator_name_that_a_narrow_table_would_cut_short"


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"specgen {__version__}"


def test_stage_lines_with_elapsed_time_when_stdout_is_not_a_terminal(capsys):
    assert main(["check", str(SPECS / "softmax.yaml")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^\[\s+\d+\.\ds\] checking .*softmax\.yaml \.\.\.$", err, re.M), err


def test_check_json_goes_alone_on_stdout(capsys):
    assert main(["check", str(SPECS / "softmax.yaml"), str(SPECS / "rope.yaml"), "--json", "-"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # nothing else on stdout
    assert data["ok"] and [s["op"] for s in data["specs"]] == ["softmax", "rope"]
    assert data["specs"][1]["signature"].startswith("rope(x: Tensor[S, H, D]") and data["specs"][0]["reference_runs"]
    assert "specgen check" in captured.err  # the table went to stderr


def test_check_json_reports_the_failure_and_its_exit_code(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((SPECS / "softmax.yaml").read_text().replace("dtypes:", "dtypez:"))
    assert main(["check", str(bad), "--json", "-"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert not data["ok"] and data["specs"][0]["exit_code"] == 2 and "dtypez" in data["specs"][0]["error"]


def test_no_op_name_is_cut_in_a_narrow_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "60")
    path = tmp_path / f"{LONG}.yaml"
    path.write_text((SPECS / "gelu_tanh.yaml").read_text().replace("gelu_tanh", LONG))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert any(f"│ {LONG} " in line for line in out.splitlines()), out  # whole, on one line

    from rich.console import Console

    from specgen.commands.report import summary_table

    data = {"ops": [{"op": LONG, "path": "kernel", "verified": False, "verification": None, "summary": {}}]}
    for width, terminal in ((200, False), (40, True)):  # a log (a page wide): one line; a terminal: folded
        console = Console(width=width, record=True, force_terminal=terminal)
        console.print(summary_table(data, console))
        first_cells = [m.group(1) for m in re.finditer(r"^│ (\S+)", console.export_text(), re.M)]
        assert "".join(first_cells) == LONG


def test_a_real_process_off_a_terminal_prints_timed_stages(tmp_path):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "specgen.cli", "check", str(SPECS / "swiglu.yaml")],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.search(r"\[\s+\d+\.\ds\] checking", result.stderr)
    assert "\x1b[" not in result.stdout  # no terminal codes in a log
    assert "swiglu" in result.stdout


@pytest.fixture
def two_specs(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "scale_add.yaml").write_text(SPEC_YAML)
    shutil.copy(SPECS / "linear_bias_relu.yaml", folder)  # the builtin generator refuses this one
    return folder


def test_generate_goes_on_past_a_refusal_and_exits_1(two_specs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("specgen.lock.gpu_available", lambda: False)
    monkeypatch.setattr("specgen.agents.evaluate.KernelEvaluator",
                        lambda task, **kwargs: ScriptedEvaluator(can_verify=False))
    code = main(["generate", str(two_specs / "linear_bias_relu.yaml"), str(two_specs / "scale_add.yaml"),
                 "--transcript-dir", str(tmp_path / "t"), "--json", "-"])
    captured = capsys.readouterr()
    assert code == 1
    assert "refused" in captured.err and "prims.transpose" in captured.err
    specs = json.loads(captured.out)["specs"]
    assert [(s["op"], s["verified"], s["exit_code"]) for s in specs] == [("linear_bias_relu", False, 1),
                                                                        ("scale_add", False, 1)]
    assert (two_specs / "kernels" / "scale_add.cu").is_file()  # the refusal did not stop the second spec


def test_generate_exits_1_when_the_kernel_is_written_but_not_verified(two_specs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("specgen.lock.gpu_available", lambda: False)
    monkeypatch.setattr("specgen.agents.evaluate.KernelEvaluator",
                        lambda task, **kwargs: ScriptedEvaluator(can_verify=False))
    with FakeLLMServer([answer("FAST")]) as server:
        code = main(["generate", str(two_specs / "scale_add.yaml"), "--agent", "openai-compatible",
                     "--base-url", server.openai_base_url, "--model", "m", "--transcript-dir",
                     str(tmp_path / "t"), "--json", "-"])
    captured = capsys.readouterr()
    assert code == 1
    assert (two_specs / "kernels" / "scale_add.cu").is_file()  # written for a GPU machine to verify
    data = json.loads(captured.out)
    assert data["specs"] == [{**data["specs"][0], "op": "scale_add", "verified": False, "exit_code": 1}]
    assert "not verified on a GPU" in data["specs"][0]["state"]
    assert "has no verified kernel" in captured.err


# a stage line off a terminal: `[    12.3s] TEXT`, the time elapsed since the command started
def timed_stage_line(text_pattern: str) -> re.Pattern:
    return re.compile(r"^\[\s*\d+\.\ds\] " + text_pattern + r"$", re.M)


def test_generate_prints_a_timed_stage_line_per_spec(two_specs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("specgen.lock.gpu_available", lambda: False)
    monkeypatch.setattr("specgen.agents.evaluate.KernelEvaluator",
                        lambda task, **kwargs: ScriptedEvaluator(can_verify=False))
    main(["generate", str(two_specs / "scale_add.yaml"), "--transcript-dir", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert timed_stage_line(r"generating scale_add with builtin \.\.\.").search(err), err


@pytest.fixture
def broken_kernel(tmp_path, monkeypatch):
    """A .cu file that does not compile, with a kernel cache of its own."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    kernel = tmp_path / "broken.cu"
    kernel.write_text("this is not CUDA;\n")
    return kernel


@pytest.mark.nvcc
def test_verify_prints_a_timed_stage_line_before_a_compile_error(broken_kernel, capsys):
    kernel = broken_kernel
    assert main(["verify", str(SPECS / "gelu_tanh.yaml"), "--kernel", str(kernel), "--arch", "sm_90"]) == 1
    captured = capsys.readouterr()
    assert timed_stage_line(r"verifying \S*broken\.cu against gelu_tanh \.\.\.").search(captured.err), captured.err
    assert "compile-error" in captured.out


@pytest.mark.nvcc
def test_bench_prints_a_timed_stage_line_while_compiling_the_kernel(broken_kernel, capsys):
    kernel = broken_kernel
    assert main(["bench", str(SPECS / "gelu_tanh.yaml"), "--kernel", str(kernel), "--arch", "sm_90"]) == 1
    err = capsys.readouterr().err
    assert timed_stage_line(r"compiling \S*broken\.cu \.\.\.").search(err), err
