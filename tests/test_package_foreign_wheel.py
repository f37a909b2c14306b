"""A wheel built on another machine (the H200: Python 3.12) installs here (another Python),
loads its compiled kernels and passes its generated CPU tests. A wheel of the current binding
requires the torch minor version it was built against (the test skips under another torch);
one of the earlier stable-ABI binding loads under any newer torch.

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


def _torch_pin(wheel: Path) -> tuple[int, int] | None:
    """(major, minor) when the wheel requires one torch minor version (a per-torch build), else None
    (a wheel of the earlier stable-ABI binding: torch >= its floor)."""
    import re
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    line = next((line for line in metadata.splitlines() if re.match(r"Requires-Dist: torch[<>=! ]", line)), "")
    floor = re.search(r">=(\d+)\.(\d+)", line)
    return (int(floor[1]), int(floor[2])) if floor and "<" in line else None


@pytest.mark.slow
def test_a_wheel_built_elsewhere_loads_its_kernels_and_passes_its_cpu_tests(tmp_path):
    wheel = _wheel()
    if wheel is None:
        pytest.skip("no wheel from the GPU machine: set SPECGEN_WHEEL=path/to/*.whl")
    assert "-cp39-abi3-" in wheel.name  # one wheel for every CPython >= 3.9
    pinned = _torch_pin(wheel)
    if pinned is not None:
        import torch

        if tuple(int(p) for p in torch.__version__.split(".")[:2]) != pinned:
            pytest.skip(f"{wheel.name} was built for torch {pinned[0]}.{pinned[1]} (its binding uses that torch's C++ "
                        f"API); torch {torch.__version__} is installed here")
    info, tests = check_wheel(wheel, tmp_path)
    assert info["kernels_loaded"], info["error"]  # the stable-ABI extension loaded under this torch
    assert sorted(info["registered"]) == sorted(info["kernel_ops"])
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout
