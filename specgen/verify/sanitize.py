"""`--sanitize`: compute-sanitizer memcheck, racecheck and initcheck over a small run of the candidate.

The small run is the verifier's own quick session (a smoke case, a few boundary cases and
one case of about four million elements, above any size a kernel could branch on; both
directions) in a child process under the sanitizer, with torch's caching allocator
off so every tensor is its own allocation and an overrun is an overrun.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .verdict import SANITIZER, Failure

TOOLS = ("memcheck", "racecheck", "initcheck")
ERROR_EXIT = 86
SANITIZER_TIMEOUT_S = 300.0


def find_compute_sanitizer() -> Path | None:
    candidates = []
    try:
        from ..toolchain import find_cuda_toolkit

        root = find_cuda_toolkit().root
        candidates += [root / "bin" / "compute-sanitizer", root / "compute-sanitizer" / "compute-sanitizer"]
    except Exception:  # no toolkit: PATH may still have one
        pass
    on_path = shutil.which("compute-sanitizer")
    if on_path:
        candidates.append(Path(on_path))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def sanitizer_command(tool: str, spec_path: Path, library: Path, seed: int, sanitizer: Path) -> list[str]:
    cmd = [str(sanitizer), "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "12"]
    if tool == "memcheck":
        cmd += ["--padding", "256"]  # an overrun lands in padding, never in a neighbouring tensor
    return cmd + [sys.executable, "-m", "specgen.verify.sanitize", str(spec_path), str(library), str(seed)]


def report_lines(output: str, limit: int = 30) -> list[str]:
    """The sanitizer's findings without its banner and the Python noise around them."""
    lines = [line for line in output.splitlines() if line.startswith("=========")]
    lines = [line for line in lines if "COMPUTE-SANITIZER" not in line and line.strip("= ")]
    return lines[:limit]


def benign_races(tool: str, found: list[str]) -> int:
    """Racecheck hazards it reports as warnings only (its summary: `N hazards displayed (0 errors,
    W warnings)`, no `Error:` line): W, else 0. racecheck sorts its hazards into errors and
    warnings, and exits with --error-exitcode for either. The builtin kernels' block reductions
    (every lane of warp 0 storing the one reduced value into the same shared word) gave warnings
    only on the H200 (session 10), the held-out missing-__syncthreads race errors. A warning is
    recorded with the seconds; an error refuses the kernel."""
    if tool != "racecheck" or any("Error:" in line for line in found):
        return 0
    for line in found:
        summary = re.search(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)", line)
        if summary:
            return int(summary[2]) if int(summary[1]) == 0 else 0
    return 0


def run_sanitizer(spec, library: Path, *, seed: int = 0, tools=TOOLS, timeout: float = SANITIZER_TIMEOUT_S) -> dict:
    """Run each tool; raise Failure(sanitizer) on the first that reports; return per-tool seconds
    (and `racecheck warnings`: their count, where racecheck reported warnings only)."""
    import time

    sanitizer = find_compute_sanitizer()
    if sanitizer is None:
        from ..errors import EnvironmentMissing

        raise EnvironmentMissing("--sanitize needs compute-sanitizer (part of the CUDA toolkit: "
                                 "$CUDA_HOME/bin/compute-sanitizer); install it or drop --sanitize")
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    seconds = {}
    for tool in tools:
        started = time.perf_counter()
        cmd = sanitizer_command(tool, Path(spec.path).resolve(), Path(library).resolve(), seed, sanitizer)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise Failure(SANITIZER, f"compute-sanitizer {tool} did not finish within {timeout:.0f} s on the "
                                     f"small run: the kernel is very slow or hangs under it") from None
        seconds[tool] = round(time.perf_counter() - started, 2)
        output = done.stdout + done.stderr
        found = report_lines(output)
        warnings = benign_races(tool, found)
        if warnings:  # exit code ERROR_EXIT for warnings alone: not a finding (see benign_races)
            seconds[f"{tool} warnings"] = warnings
        elif done.returncode == ERROR_EXIT or any("ERROR SUMMARY: " in l and "0 errors" not in l for l in found) \
                or any("Error:" in l or "Invalid " in l for l in found):
            raise Failure(SANITIZER, f"compute-sanitizer {tool} reported errors on a small run:\n" +
                          "\n".join(found[:25]) +
                          ("\nA race: add __syncthreads() (or __syncwarp()) between the writes and the reads "
                           "of shared memory by different threads." if tool == "racecheck" else
                           "\nAn out-of-bounds or misaligned access: guard every load and store with the "
                           "tensor's size, including the last partial vector."))
        if done.returncode not in (0, ERROR_EXIT) or (done.returncode == ERROR_EXIT and not warnings):
            raise Failure(SANITIZER, f"the small run under compute-sanitizer {tool} failed (exit code "
                                     f"{done.returncode}):\n" + "\n".join(output.strip().splitlines()[-15:]))
    return seconds


def sanitize_before_lock(spec, library: Path, *, seed: int = 0) -> dict | None:
    """The sanitizer over the kernel about to be locked (the default of `generate` and `build` on
    a GPU; every candidate only with --sanitize, as it costs about 50 s a kernel on the H200):
    per-tool seconds, None where no compute-sanitizer is installed; Failure(sanitizer) on a finding.
    Races and reads past a tensor that the verifier's runs cannot see are found here before a
    kernel reaches a package."""
    if find_compute_sanitizer() is None:
        return None
    return run_sanitizer(spec, library, seed=seed)


def _child(spec_path: str, library: str, seed: str) -> int:
    """Inside the sanitizer: the quick session; its verdict does not matter here, the
    sanitizer's findings do (a wrong result is found by the full run)."""
    from ..spec import load_spec
    from .engine import Options, run_verification

    # In this process (not the isolated runner): the sanitizer must see the kernel's accesses
    # to ordinary allocations; its quick session ends with a case of SANITIZER_ELEMENTS.
    verdict = run_verification(load_spec(spec_path), library, Options(examples=0, seed=int(seed), quick=True),
                               isolated=False)
    print(f"quick run under the sanitizer: {verdict.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:4]))
