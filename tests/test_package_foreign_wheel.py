"""A wheel built on another machine (the H200: torch 2.11, Python 3.12) installs here (another
torch and Python), loads its stable-ABI kernels and passes its generated CPU tests.

    SPECGEN_WHEEL=gpu-out/package/specgen_kernels-0.1.0-cp39-abi3-linux_x86_64.whl python -m pytest tests/test_package_foreign_wheel.py

Without SPECGEN_WHEEL, the newest wheel under gpu-out/package/ (a local GPU run) is used, else
the newest one committed under benchmarks/results/*/package/ (the H200 wheel of record, so CI
re-proves with each torch it installs that the abi3 wheel still loads); else the test skips.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from specgen.package.check_wheel import check_wheel

REPO = Path(__file__).resolve().parent.parent


def _wheel() -> Path | None:
    if os.environ.get("SPECGEN_WHEEL"):
        return Path(os.environ["SPECGEN_WHEEL"]).resolve()
    local = sorted((REPO / "gpu-out/package").glob("*-abi3-*.whl"), key=lambda p: p.stat().st_mtime)
    if local:
        return local[-1]
    # result folders are named by date, so the last one by name is the newest record
    committed = sorted((REPO / "benchmarks/results").glob("*/package/*-abi3-*.whl"))
    return committed[-1] if committed else None


@pytest.mark.slow
def test_a_wheel_built_elsewhere_loads_its_kernels_and_passes_its_cpu_tests(tmp_path):
    wheel = _wheel()
    if wheel is None:
        pytest.skip("no wheel from the GPU machine: set SPECGEN_WHEEL=path/to/*.whl")
    assert "-cp39-abi3-" in wheel.name  # one wheel for every CPython >= 3.9
    info, tests = check_wheel(wheel, tmp_path)
    assert info["kernels_loaded"], info["error"]  # the stable-ABI extension loaded under this torch
    assert sorted(info["registered"]) == sorted(info["kernel_ops"])
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout
