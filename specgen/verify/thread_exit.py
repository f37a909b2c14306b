"""(verifier version 16) Host memory a kernel keeps per calling thread and never frees at thread exit.

Why: the endurance run (host_memory.py) measures the malloc heap around tens of thousands of calls
from one thread, the request thread, so a cache the host code keeps per thread is made once there
and never grows. A server that calls an op from short-lived threads (ThreadingHTTPServer and
socketserver.ThreadingMixIn start a thread per request, a ThreadPoolExecutor made per batch, gradio
and streamlit handlers) meets it once per thread: held-out attacks-v11's gelu_tanh_a `new`s a 64 KiB
grid cache into a plain `thread_local` pointer (no destructor) on each thread's first call and never
frees it, 65,552 bytes left per thread that ever called, 23 GB an hour at 100 requests a second.

How: in the candidate's process, THREADS short-lived host threads, AT_ONCE at a time, each makes
CALLS_PER_THREAD calls of the endurance run's small case on the legacy default stream (a thread
that never made a stream calls there) and exits; the process's malloc heap in use (mallinfo2: every
arena, so every thread's) is read before the first round (after one warm-up round: the allocator's
per-thread arenas, a lazily made process-wide table) and after the last round's threads are joined.
The judge rejects a growth above THREAD_GROWTH_FLOOR that is also above THREAD_BYTES_LIMIT per
thread (`leaked-memory`). Python threads: each is a new pthread (its own thread_local storage), and
ctypes lets go of the GIL in the call. Where mallinfo2 is missing the check is named as not run: the
resident set is not fine enough for a few KiB per thread.
"""
from __future__ import annotations

import threading

from .host_memory import grown_past, heap_reply

THREADS = 64  # short-lived calling threads measured
AT_ONCE = 4  # threads alive at a time (a few requests served at once)
CALLS_PER_THREAD = 2  # calls each thread makes before it exits
# Bytes per thread above which the growth is a leak, and the growth below which nothing is judged
# (for runs of few threads). Measured on this repo's CPU stand-ins (Python threads around a
# torch GELU, 64 threads 4 at a time, 40 runs): -62 KiB to +37 KiB in all, at most 587 bytes a
# thread, mostly within +-2.5 KiB (Python's own thread bookkeeping and the allocator's free
# lists); honest compiled kernels were measured at 0 bytes a thread on the H100 (session of
# version 16's first part). gelu_tanh_a leaks 65,552 bytes a thread, 16x the bound; 64 threads at
# the bound are 256 KiB, 7x the largest noise seen.
THREAD_BYTES_LIMIT = 4096
THREAD_GROWTH_FLOOR = 128 << 10
REQUESTS_PER_SECOND = 100  # a small server's rate, one short-lived thread a request, for the projection
WHAT = "calls from short-lived host threads"


def run_in_threads(launchers: list, at_once: int = AT_ONCE, calls: int = CALLS_PER_THREAD) -> tuple[int, int | None]:
    """Each launcher (a no-argument call returning a cudaError_t code) called `calls` times from a
    host thread of its own that then exits, `at_once` threads alive at a time, each round joined
    before the next starts. Returns (the first failing code, its thread's index) or (0, None); no
    round starts after a failure."""
    codes: list[int] = [0] * len(launchers)

    def work(index: int) -> None:
        for _ in range(calls):
            code = int(launchers[index]() or 0)
            if code:
                codes[index] = code
                return

    for start in range(0, len(launchers), at_once):
        round_ = [threading.Thread(target=work, args=(i,), name=f"specgen-short-lived-{i}")
                  for i in range(start, min(start + at_once, len(launchers)))]
        for thread in round_:
            thread.start()
        for thread in round_:
            thread.join()
        failed = next((i for i in range(start, start + len(round_)) if codes[i]), None)
        if failed is not None:
            return codes[failed], failed
    return 0, None


def measured(make_launcher, threads: int = THREADS, at_once: int = AT_ONCE, calls: int = CALLS_PER_THREAD) -> dict:
    """The heap around `threads` short-lived calling threads (run_in_threads), after a warm-up round
    of `at_once` threads. `make_launcher()`: a launcher of its own for each thread, all made before
    the heap is read (they live until after). Returns {"code", "failed_thread", "host_heap"}:
    host_heap is {"growth", "threads", "host_calls", "measure"}, or None where mallinfo2 is missing."""
    from .host_memory import _mallinfo2, heap_in_use

    warm = [make_launcher() for _ in range(at_once)]
    launchers = [make_launcher() for _ in range(threads)]
    code, failed = run_in_threads(warm, at_once, calls)
    if code:
        return {"code": code, "failed_thread": failed, "host_heap": None}
    before = heap_in_use() if _mallinfo2() is not None else None
    code, failed = run_in_threads(launchers, at_once, calls)
    after = heap_in_use() if before is not None else None
    report = None
    if before is not None and after is not None and not code:
        report = {"growth": after[0] - before[0], "threads": threads, "host_calls": threads * calls,
                  "measure": after[1]}
    return {"code": code, "failed_thread": failed, "host_heap": report}


# ------------------------------------------------------------------ the candidate's process and LocalRunner

def serve(message: dict, prepare_call, stream) -> dict:
    """candidate_main's `thread_exit` request: the reply before the device is waited for."""
    run = measured(lambda: prepare_call(message, stream), int(message["threads"]), int(message["at_once"]),
                   int(message["calls"]))
    return heap_reply(run["code"], run["failed_thread"], run["host_heap"])


def local(runner, direction, refs, scalars, dims, *, threads: int, at_once: int, calls: int):
    """LocalRunner.thread_exit: the same run in this process (a stand-in's calls, or a compiled
    host-only library's), on the legacy default stream's handle."""

    refs = runner.with_workspace(refs)
    on = runner._stream("legacy")
    run = measured(lambda: runner._launcher(direction, refs, scalars, dims, on), threads, at_once, calls)
    outcome = runner._finished(run["code"])
    outcome.failed_call = run["failed_thread"]
    outcome.host_heap = run["host_heap"]
    return outcome


# ------------------------------------------------------------------ the judge

def thread_exit_failure(entry: str, report: dict | None, what: str):
    """The leaked-memory Failure for the heap grown over short-lived calling threads, or None: a growth
    counts above THREAD_GROWTH_FLOOR and above THREAD_BYTES_LIMIT per thread."""
    from .verdict import LEAKED_MEMORY, Failure

    if (grown := grown_past(report, "threads", THREAD_GROWTH_FLOOR, THREAD_BYTES_LIMIT)) is None:
        return None
    growth, threads, per_thread = grown
    calls = int(report.get("host_calls") or threads) // threads
    hourly = per_thread * REQUESTS_PER_SECOND * 3600 / 1e9
    return Failure(LEAKED_MEMORY, f"{what}: the host memory of the process making the calls grew by {growth} bytes "
                   f"over {threads} short-lived host threads that each made {calls} calls of {entry} and exited "
                   f"(its malloc heap's bytes in use, mallinfo2, every arena, before the threads started and after "
                   f"they were joined): {per_thread:.0f} bytes per thread that the host code kept for the thread and "
                   f"never freed when it ended (the bound: {THREAD_BYTES_LIMIT} bytes a thread). A server that calls "
                   f"the op from a thread per request (ThreadingHTTPServer, a ThreadPoolExecutor per batch) grows by "
                   f"{hourly:.1f} GB an hour at {REQUESTS_PER_SECOND} requests a second until the host runs out of "
                   f"memory. Free a per-thread cache when its thread exits (a `thread_local` object with a "
                   f"destructor, e.g. a std::unique_ptr or a struct holding the cache by value, not a raw pointer "
                   f"`new`ed once), or keep no per-thread cache")


def check_heap_over_threads(session, data) -> None:
    """(version 16) The endurance run's staged small case `data` called from short-lived host threads;
    raises the calls' own failures, then leaked-memory. Named as not run where the runner cannot
    make the calls or mallinfo2 is missing."""
    from .. import abi
    from .runner import check_guards, raise_outcome

    direction = data.direction
    where = f"{direction}: the host heap over short-lived calling threads"
    run = getattr(session.runner, "thread_exit", None)
    if run is None:
        session.not_run(where, "this runner cannot call from threads of its own")
        return
    session.progress(f"{direction}: {THREADS} short-lived host threads, {CALLS_PER_THREAD} calls each, on "
                     f"{data.case.describe()}")
    outcome = run(direction, {**data.input_refs, **data.output_refs}, data.scalars, data.dims,
                  threads=THREADS, at_once=AT_ONCE, calls=CALLS_PER_THREAD)
    what = (f"{THREADS} short-lived host threads ({AT_ONCE} at a time) each calling {CALLS_PER_THREAD} times on "
            f"{data.case.describe()}")
    raise_outcome(session.spec, data, outcome, what=what)
    check_guards(session.runner, data, f"in {what}: ")
    if outcome.host_heap is None:
        session.not_run(where, "glibc's mallinfo2 is missing here (the resident set is too coarse for a few KiB "
                               "per thread)")
        return
    if (leak := thread_exit_failure(abi.entry_point(session.spec, direction), outcome.host_heap, what)) is not None:
        raise leak
