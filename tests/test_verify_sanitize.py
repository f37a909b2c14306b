"""The sanitizer's verdicts from compute-sanitizer's output (a stand-in process: no GPU): a
racecheck report of warnings only is recorded, an error refuses, memcheck's exit code refuses."""
from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from specgen.verify import sanitize
from specgen.verify.verdict import Failure

WARNINGS = """========= COMPUTE-SANITIZER
========= Warning: Race reported between Read access at void sg::group_reduce2<256, 256>(...)+0x1dc0 in rmsnorm.cu:196
=========     and Write access at void sg::group_reduce2<256, 256>(...)+0x1ee0 in rmsnorm.cu:198 [148 hazards]
========= RACECHECK SUMMARY: 10 hazards displayed (0 errors, 10 warnings)
"""
ERRORS = """========= COMPUTE-SANITIZER
========= Error: Race reported between Read access at void rc_sm<float>(...)+0x600 in race.cu:201
=========     and Write access at void rc_sm<float>(...)+0x890 in race.cu:206 [160 hazards]
========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)
"""


@pytest.fixture
def sanitizer(monkeypatch, tmp_path):
    """run_sanitizer over a stand-in compute-sanitizer whose output per tool the test sets."""
    outputs = {}
    monkeypatch.setattr(sanitize, "find_compute_sanitizer", lambda: Path("/bin/true"))

    def run(cmd, **_):
        tool = cmd[cmd.index("--tool") + 1]
        code, text = outputs.get(tool, (0, "========= ERROR SUMMARY: 0 errors\n"))
        return subprocess.CompletedProcess(cmd, code, text, "")

    monkeypatch.setattr(sanitize.subprocess, "run", run)
    spec = SimpleNamespace(path=tmp_path / "op.yaml")
    return outputs, lambda: sanitize.run_sanitizer(spec, tmp_path / "lib.so")


def test_racecheck_warnings_alone_are_recorded_not_refused(sanitizer):
    outputs, run = sanitizer
    outputs["racecheck"] = (sanitize.ERROR_EXIT, WARNINGS)
    seconds = run()
    assert seconds["racecheck warnings"] == 10 and set(sanitize.TOOLS) <= set(seconds)


def test_a_racecheck_error_refuses_the_kernel(sanitizer):
    outputs, run = sanitizer
    outputs["racecheck"] = (sanitize.ERROR_EXIT, ERRORS + WARNINGS.replace("(0 errors", "(3 errors"))
    with pytest.raises(Failure, match="racecheck reported errors"):
        run()
    assert sanitize.benign_races("racecheck", WARNINGS.replace("(0 errors", "(1 error").splitlines()) == 0


def test_memcheck_findings_refuse_whatever_their_wording(sanitizer):
    outputs, run = sanitizer
    outputs["memcheck"] = (sanitize.ERROR_EXIT, "========= Invalid __global__ read of size 4\n"
                                                "========= ERROR SUMMARY: 1 error\n")
    with pytest.raises(Failure, match="memcheck reported errors"):
        run()
    assert sanitize.benign_races("memcheck", WARNINGS.splitlines()) == 0  # only racecheck has warnings


def test_a_crash_under_the_sanitizer_is_a_failure_not_a_pass(sanitizer):
    outputs, run = sanitizer
    outputs["initcheck"] = (1, "Traceback (most recent call last):\nRuntimeError: CUDA error\n")
    with pytest.raises(Failure, match="failed \\(exit code 1\\)"):
        run()
