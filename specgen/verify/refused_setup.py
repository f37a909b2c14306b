"""(verifier version 16) Optional setup refused, as under MPS: a candidate process where
cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, ...) fails.

Why: under MPS (the CUDA Programming Guide: the L2 set-aside cannot be changed by cudaDeviceSetLimit
there, only by the MPS daemon's environment) and on vGPU profiles that refuse the limit, a kernel's
persisting-L2 set-aside fails. The verifier's GPU grants it, so a kernel that handles the refusal
badly is never seen doing so: held-out attacks-v11's rope_a launches without its access-policy
window when refused but leaves the failed call's error pending and returns success, and the
model's next PyTorch launch raises it from an unrelated op (pending_error.py catches the pending
error; this module makes the refusal happen).

How: where the library imports cudaDeviceSetLimit (the only way a kernel reaches that limit: the
driver API and cudaGetDriverEntryPoint are refused by the static checks), one more process of the
candidate's per direction, started with an LD_PRELOAD shim (refused_setup_shim.c, built here with
the system's C compiler and cached by content) that refuses that one limit through the real runtime
(so the runtime itself returns and records the error: cudaErrorUnsupportedLimit) and forwards every
other limit. Its first call (the one that does a first-call setup) is checked, then the smoke case
twice and one boundary case: outputs right, and no error pending after a call that returned
success. A call that returns an error there is accepted: the caller sees the refusal and can act on
it (the check then ends for that direction).

The candidate's library is built with `-cudart shared` (toolchain/compile.py), so its
cudaDeviceSetLimit is an undefined dynamic symbol that the preloaded shim interposes on; a library
linked statically with the runtime would not be intercepted, and specgen never builds one. A
library that does not import cudaDeviceSetLimit skips the check (the shim would meet nothing), so
it costs nothing there; else one process start per direction and five calls.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from .shims import build_shim, c_compiler, cudart_soname, preload_env, preloaded_process  # noqa: F401 (the tests')

SHIM_SOURCE = Path(__file__).with_name("refused_setup_shim.c")
INTERCEPTED = "cudaDeviceSetLimit"
PERSISTING_L2 = 6  # cudaLimitPersistingL2CacheSize
WHERE = ("where the persisting-L2 set-aside is refused (cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize) fails, as "
         "under MPS or a vGPU profile that refuses it; a process of its own, the refusal made by an LD_PRELOAD shim)")


def imports_set_limit(library) -> bool:
    """Whether the compiled library calls cudaDeviceSetLimit (an undefined dynamic symbol)."""
    from ..toolchain.symbols import undefined_symbols

    return INTERCEPTED in undefined_symbols(Path(library))


def shim_library(soname: str = "libcudart.so.13", cache_dir: Path | None = None) -> tuple[Path | None, str | None]:
    """(the shim built for the runtime `soname`, None) or (None, why it could not be built); cached by
    content (shims.build_shim): a second verification reuses the file."""
    return build_shim(SHIM_SOURCE, "refused-setup", {"CUDART_SONAME": f'"{soname}"'}, cache_dir)


def refused_runner(spec, library, progress: Callable[[str], None] = lambda text: None,
                   cache_dir: Path | None = None) -> Callable[[], tuple[object | None, str | None]] | None:
    """For engine.run_verification: None where the check has nothing to meet (a stand-in, or a
    library that never calls cudaDeviceSetLimit); else a function that starts and loads the
    candidate's process with the shim: (runner, None), or (None, why it could not be started)."""
    if not isinstance(library, (str, Path)):
        return None
    try:
        if not imports_set_limit(library):
            return None
        soname = cudart_soname(library) or "libcudart.so.13"
    except Exception:  # noqa: BLE001 - an unreadable library is the static checks' business
        return None

    def start():
        shim, why = shim_library(soname, cache_dir)
        if shim is None:
            return None, why
        return preloaded_process(spec, library, shim, "the set-aside refused", WHERE, progress), None
    return start


def check_refused_setup(session, direction: str) -> None:
    """The candidate's calls in a process where the set-aside is refused (`session.refused_runner`,
    set by run_verification; none: nothing to do): its first call, checked; then the smoke case
    checked twice and one boundary case. A Failure names the situation."""
    from .checks import check_case, check_close
    from .data import stage
    from .runner import check_guards, fill_outputs, raise_outcome, synchronize
    from .strategies import boundary_cases, smoke_case
    from .verdict import Failure

    start = getattr(session, "refused_runner", None)
    if start is None:
        return
    spec, opts = session.spec, session.options
    session.progress(f"{direction}: its calls in a process where the persisting-L2 set-aside is refused, as under MPS")
    runner, why = start()
    if runner is None:
        session.not_run(f"{direction}: the calls where the persisting-L2 set-aside is refused", why)
        return
    smoke = smoke_case(spec, opts.seed + 19)
    boundary = boundary_cases(spec, opts.budget, opts.seed + 19, session.domain)
    cases = [(smoke, "legacy"), *((boundary[len(boundary) // 2], "pool") for _ in boundary[:1])]
    try:
        for number, (case, stream) in enumerate(cases):
            data = session.prepare(dataclasses.replace(case, seed=case.seed + 9100 + number), direction)
            stage(runner, data, snapshots=False)
            session.cases += 1
            if number == 0:  # its first call in the process: where a first-call setup is refused
                fill_outputs(runner, data.output_refs, 0)
                synchronize(data.device)
                outcome = runner.call(direction, data.refs(), data.scalars, data.dims, stream=stream)
                if returned_the_refusal(outcome):
                    session.progress(f"{direction}: it returned {outcome.error} ({outcome.code}) where the set-aside "
                                     f"is refused: the caller sees the refusal (accepted)")
                    return
                raise_outcome(spec, data, outcome, what=f"its first call {WHERE}")
                check_guards(runner, data)
                check_close(data, {name: runner.tensor(ref).clone() for name, ref in data.output_refs.items()},
                            prefix="its first call: ")
            check_case(runner, data, deterministic=spec.deterministic, stream=stream)
    except Failure as failure:
        raise Failure(failure.reason, f"{WHERE}: {failure.detail}", failure.counterexample,
                      fatal=failure.fatal) from None
    finally:
        runner.close()


def returned_the_refusal(outcome) -> bool:
    """A call that came back with a plain error code (not a lost context, a hang or a workspace
    shortfall): where only the set-aside differs, the kernel returned the refusal to its caller."""
    from .library import STICKY_ERRORS, WORKSPACE_SHORT

    return bool(outcome.code) and not outcome.fatal and not outcome.timeout and \
        outcome.code not in STICKY_ERRORS and outcome.code != WORKSPACE_SHORT
