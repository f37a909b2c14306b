"""The verifier: every kernel specgen ships passes through `verify_kernel`.

Static checks first (compile, symbols, module memory, entry points: no GPU needed), then, on
the GPU, optionally compute-sanitizer, then the worker's run of every correctness and anti-cheat
check. The result is a `Verdict` with one stable reason (see verdict.REASONS).
"""
from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

from .verdict import COMPILE_ERROR, PASSED, REASONS, Counterexample, Failure, Verdict

DEFAULT_EXAMPLES = 30
VERIFIER_VERSION = "16"  # bump when a check changes meaning: lock records are keyed by it
# 2: every dtype at the widest row and half of it (schedules switch by row width)
# 3: the candidate in its own process (read-only inputs, guard bytes), CUDA-graph capture, timed
#    calls checked output by output, the physics floor, full-size cases, value classes, drawn
#    scalars, size sweeps, per-element tolerance (docs/VERIFIER.md)
# 4: the model's loop, endurance, the benchmark's cadence, the CPU's second truth at NaN/inf inputs
# 5: calls side by side, a copy on the call's stream with the default streams held busy, the
#    quantized and sparse value classes, loss-scaled and special output gradients, model-size
#    full-size cases (session 26)
# 13: held-out attacks-v10 (session 38): the first call in each dtype, capture at decode sizes, zero
#    output gradients, odd twins in every dtype, past 2^32 elements, widths where 48 KiB of shared
#    memory ends, rounding direction, scratch parked in the pool, local memory, host memory per call


def static_checks(spec, kernel, *, arch: str | None = None, cache_dir: Path | None = None) -> tuple[Verdict | None, object]:
    """Compile, symbols, module memory, entry points. Returns (a rejecting verdict or None, the
    CompiledKernel or None)."""
    from ..abi import write_header
    from ..toolchain import CompileError, compile_kernel, defined_symbols, read_source
    from .checks import (check_entry_points, check_library_symbols, check_module_memory, check_stream_calls,
                         check_workspace_function)

    with tempfile.TemporaryDirectory(prefix="specgen-abi-") as header_dir:
        write_header(spec, header_dir)
        source_name = str(kernel) if isinstance(kernel, Path) or "\n" not in str(kernel) else f"{spec.name}.cu"
        try:
            compiled = compile_kernel(kernel, include_dirs=[Path(header_dir)], arch=arch, name=spec.name,
                                      source_name=source_name, cache_dir=cache_dir)
        except CompileError as error:
            return Verdict(COMPILE_ERROR, str(error), log=error.log[-4000:]), None
    timings = {"compile_s": round(compiled.seconds, 3), "compile_cached": compiled.cached}
    try:
        check_library_symbols(compiled.library, spec)
        check_stream_calls(compiled.library)
        check_module_memory(compiled.module_memory_bytes, source_name, spec)
        defined = defined_symbols(compiled.library)
        check_entry_points(defined, spec)
        check_workspace_function(spec, read_source(kernel)[0], defined)
    except Failure as failure:
        return Verdict.from_failure(failure, timings=timings), compiled
    return None, compiled


def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


@contextlib.contextmanager
def unsigned_char_build_beside(spec, kernel, arch: str | None, cache_dir: Path | None, start_now: bool):
    """Yields build(arch) -> the unsigned-char CompiledKernel (char_abi.build_unsigned_char). With
    `start_now` (a GPU will run it), nvcc starts on it now, beside the normal build (one more nvcc
    process: 9-11 s of a verification on the H100, session 45), and build() waits for it; without,
    nothing starts and build() compiles then."""
    from concurrent.futures import ThreadPoolExecutor

    from ..toolchain import detect_gpu_arch
    from .char_abi import build_unsigned_char

    def build_now(resolved: str):
        return build_unsigned_char(spec, kernel, arch=resolved, cache_dir=cache_dir)

    if not start_now:
        yield build_now
        return
    # compile_kernel's own default, so the two builds are for one architecture
    target = arch or detect_gpu_arch() or "sm_90"
    with ThreadPoolExecutor(1, thread_name_prefix="specgen-unsigned-char") as pool:
        started = pool.submit(build_now, target)
        yield lambda resolved: started.result() if resolved == target else build_now(resolved)


def verify_kernel(spec, kernel, *, examples: int = DEFAULT_EXAMPLES, seed: int = 0, sanitize: bool = False,
                  arch: str | None = None, worker=None, budget: int | None = None, idle_timeout: float | None = None,
                  cache_dir: Path | None = None, on_progress=None) -> Verdict:
    """Verify one candidate (`kernel`: a .cu path or its source text) against `spec`.

    Raises EnvironmentMissing when the static checks pass but there is no GPU to run it on.
    """
    from ..errors import EnvironmentMissing
    from .sanitize import run_sanitizer
    from .strategies import DEFAULT_BUDGET_ELEMENTS
    from .worker import IDLE_TIMEOUT_S, shared_worker

    started = time.perf_counter()
    label = {"spec": str(spec.path), "kernel": str(kernel) if "\n" not in str(kernel) else "<source>"}
    on_gpu = gpu_available()
    with unsigned_char_build_beside(spec, kernel, arch, cache_dir, start_now=on_gpu) as unsigned_build:
        verdict, compiled = static_checks(spec, kernel, arch=arch, cache_dir=cache_dir)
        if verdict is not None:
            verdict.spec, verdict.kernel = label["spec"], label["kernel"]
            return verdict
        timings = {"compile_s": round(compiled.seconds, 3), "compile_cached": compiled.cached}
        if not on_gpu:
            raise EnvironmentMissing("no CUDA GPU is visible: the kernel compiled and its symbols are clean, but "
                                     "verifying it means running it. Run `specgen verify` on a machine with a GPU")
        try:  # (version 16) the build with plain char unsigned, as on aarch64 hosts (char_abi.py)
            unsigned = unsigned_build(compiled.arch)
        except Failure as failure:
            return Verdict.from_failure(failure, timings=timings, **label)
    timings["compile_unsigned_char_s"] = round(unsigned.seconds, 3)
    if sanitize:
        try:
            timings["sanitize_s"] = run_sanitizer(spec, compiled.library, seed=seed)
        except Failure as failure:
            return Verdict.from_failure(failure, timings=timings, **label)
    worker = worker or shared_worker()
    options = {"examples": examples, "seed": seed, "budget": budget or DEFAULT_BUDGET_ELEMENTS,
               "unsigned_char_library": str(unsigned.library)}
    verdict = worker.verify(spec.path, compiled.library, options, idle_timeout=idle_timeout or IDLE_TIMEOUT_S,
                            on_progress=on_progress)
    verdict.timings = {**timings, **verdict.timings, "total_s": round(time.perf_counter() - started, 3)}
    verdict.spec, verdict.kernel = label["spec"], label["kernel"]
    return verdict


__all__ = ["DEFAULT_EXAMPLES", "VERIFIER_VERSION", "REASONS", "Counterexample", "Failure", "Verdict",
           "gpu_available", "static_checks", "verify_kernel", "PASSED"]
