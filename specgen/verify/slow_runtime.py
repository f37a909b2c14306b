"""(verifier version 16) Host threads on different shapes at once, with the CUDA runtime made slow.

Why: a kernel's host code that keeps state between calls (a plan, a buffer for two callers, a lock
the first caller skips) is wrong only while two threads are inside it at once, and at full speed
the window between reading that state and launching is a few instructions wide: on an H100 groups
of eight threads passed held-out attacks-v11's swiglu_b (row-range buffers for two callers, a third
writes buffer 0 under its owner) and rmsnorm_a (the first caller reads its plan without the lock)
in 8 of 8 runs each (session 43). And the groups of three threads (threaded.thread_groups) call one
shape on values of their own, where a torn plan is the same plan: swiglu_b's ranges depend on the
row count alone.

How: one more process of the candidate's per direction, started with an LD_PRELOAD shim
(slow_runtime_shim.c, built like refused_setup.py's: shims.build_shim) that makes the runtime calls
host code makes between its state and its launch wait a random 0 to MAX_DELAY_US microseconds: the
device and its attributes, occupancy, function attributes, stream-ordered memory, and the launch,
`<<<...>>>`'s configuration push included, which runs before the launch's arguments are copied. A
window of a few instructions becomes tens of microseconds. There, SLOW_THREADS native threads
(threaded.check_calls_from_threads) call at once, each on a row count of its own past any one-wave
grid's block count (SLOW_ROWS: row ranges differ between them), SLOW_CALLS calls each, every output
set checked against its thread's truth. Their calls are the process's first (each case is called alone
after them, for its bits), so the process's first caller is one of the threads and calls beside the
others (rmsnorm_a's owner). Not run for CPU stand-ins (no runtime to slow).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .shims import build_shim, cudart_soname, preloaded_process

SHIM_SOURCE = Path(__file__).with_name("slow_runtime_shim.c")
MAX_DELAY_US = 40  # the most one runtime call waits (a call makes a few: ~0.1 ms a call in all)
SLOW_ROWS = (1021, 1531, 2039, 3067)  # one per thread: past a one-wave grid's blocks (132 SMs x a few)
SLOW_THREADS = len(SLOW_ROWS)
SLOW_WIDTH = 64  # the row's width where the spec's range allows: small cases, many rows
SLOW_CALLS = 200  # calls each thread makes in a row (threaded.THREAD_CALLS)
SEED_OFFSET = 5400  # the threads' values: other draws than every other check's
WHERE = (f"with the CUDA runtime slowed (every runtime call the host code makes, the launch included, made to "
         f"wait up to {MAX_DELAY_US} us by an LD_PRELOAD shim in a process of its own, so a race between host "
         f"threads that is a few instructions wide at full speed is met)")


def slow_cases(spec, seed: int, budget: int) -> list:
    """One case per thread: the first input's first dim that is not the row at each of SLOW_ROWS
    (within its range), the row SLOW_WIDTH wide, every other dim at its smallest; each fit to the
    budget keeping the row count; distinct shapes only (at least two cases: the first again on
    values of its own where the range allows one shape)."""
    import dataclasses

    from .strategies import fit_budget, legal_sizes, make_case, row_symbol

    sig = spec.signature
    steps = sig.symbol_divisors()
    row = row_symbol(sig)
    leads = [d.symbol for d in sig.inputs[0].type.dims if d.symbol and d.symbol != row] if sig.inputs else []
    lead = leads[0] if leads else None
    cases = []
    for number, rows in enumerate(SLOW_ROWS):
        wanted = {s: 1 for s in sig.symbols()}
        if row is not None:
            wanted[row] = SLOW_WIDTH
        if lead is not None:
            wanted[lead] = rows
        dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [wanted[s]])[0] for s in wanted}
        dims = fit_budget(sig, dims, spec.dims, budget, keep=lead)
        case = make_case(dims, spec.dtypes[number % len(spec.dtypes)], seed=seed + SEED_OFFSET + number)
        if all(c.dim_map != case.dim_map or c.dtype != case.dtype for c in cases):
            cases.append(case)
    if len(cases) == 1:
        cases.append(dataclasses.replace(cases[0], seed=cases[0].seed + len(SLOW_ROWS)))
    return cases


def slow_runner(spec, library, progress: Callable[[str], None] = lambda text: None,
                cache_dir: Path | None = None) -> Callable[[], tuple[object | None, str | None]] | None:
    """For engine.run_verification: None for a stand-in (no library file, no runtime to slow); else
    a function that starts and loads the candidate's process under the shim: (runner, None), or
    (None, why it could not be started)."""
    if not isinstance(library, (str, Path)):
        return None
    try:
        soname = cudart_soname(library) or "libcudart.so.13"
    except Exception:  # noqa: BLE001 - an unreadable library is the static checks' business
        soname = "libcudart.so.13"

    def start():
        shim, why = build_shim(SHIM_SOURCE, "slow-runtime",
                               {"CUDART_SONAME": f'"{soname}"', "MAX_DELAY_US": str(MAX_DELAY_US)}, cache_dir)
        if shim is None:
            return None, why
        return preloaded_process(spec, library, shim, "the CUDA runtime slowed", WHERE, progress), None
    return start


def check_threads_on_a_slow_runtime(session, direction: str) -> None:
    """SLOW_THREADS threads at once on slow_cases in the slowed process (`session.slow_runner`, set by
    run_verification; None: nothing to do). A Failure names the situation."""
    from .data import prepare
    from .threaded import check_calls_from_threads
    from .verdict import Failure

    start = getattr(session, "slow_runner", None)
    if start is None:
        return
    spec, opts = session.spec, session.options
    cases = slow_cases(spec, opts.seed, opts.budget)
    session.progress(f"{direction}: calls from {len(cases)} host threads at the same time with the CUDA runtime "
                     f"slowed, " + ", ".join(case.describe() for case in cases))
    runner, why = start()
    if runner is None:
        session.not_run(f"{direction}: the calls from host threads with the CUDA runtime slowed", why)
        return
    try:
        threaded = [prepare(spec, case, direction, session.device) for case in cases]
        # fresh: the threads' calls are the process's first (each case alone after them), so one of them is
        # the first caller: state a first caller keeps for itself (a plan it reads without the lock) is met
        check_calls_from_threads(runner, threaded, deterministic=spec.deterministic, repeat=SLOW_CALLS, fresh=True)
        session.cases += len(threaded)
    except Failure as failure:
        raise Failure(failure.reason, f"{WHERE}: {failure.detail}", failure.counterexample,
                      fatal=failure.fatal) from None
    finally:
        runner.close()

