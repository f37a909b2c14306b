"""One call captured into a CUDA graph, one call repeated as a long run repeats it, calls
launched to run at the same time on streams of their own, and calls from host threads of their
own: shared by the candidate's process and the in-process runner (CPU stand-ins use only the
threads'). No checking code here: the candidate's process imports it."""
from __future__ import annotations

import ctypes
from typing import Callable


def capture_one_call(launch: Callable[[object], int]):
    """Capture `launch(stream)` on a fresh stream: (graph or None, the call's return code, the
    capture's error in one line or None). The graph is kept only when both are clean; an error
    from capture_begin itself (before the kernel runs) propagates."""
    import torch

    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    torch.cuda.synchronize()
    code, problem = 0, None
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            code = launch(side)
        finally:
            try:
                graph.capture_end()
            except Exception as error:  # noqa: BLE001 - the kernel broke the capture
                lines = str(error).strip().splitlines()
                problem = lines[0] if lines else type(error).__name__
    return (graph if problem is None and not code else None), code, problem


def repeat_calls(launcher_on: Callable[[object], Callable[[], int]], stream, *, host_calls: int, graph_calls: int,
                 replays: int) -> tuple[int, str | None]:
    """The same call many times, as a long training or serving run makes it: `host_calls`
    launches from the host on `stream`, then a CUDA graph of `graph_calls` launches replayed
    `replays` times (a counter kept on the device counts those too). `launcher_on(stream)`
    gives the call on a stream. Returns (the first failing call's code or 0, the capture's
    error or None)."""
    import torch

    launch = launcher_on(stream)
    torch.cuda.synchronize()
    for _ in range(host_calls):
        code = launch()
        if code:
            return code, None
    torch.cuda.synchronize()

    def many(on_stream) -> int:
        once = launcher_on(on_stream)
        for _ in range(graph_calls):
            code = once()
            if code:
                return code
        return 0

    graph, code, problem = capture_one_call(many)
    if graph is None:
        return code, problem or "capture failed"
    for _ in range(replays):
        graph.replay()
    return 0, None


# Device cycles a stream spins before a checked call (about 100 us at the H200's 1.98 GHz): the
# host launches the call (or every call of a side-by-side check) meanwhile, so the device starts
# them without waiting on the host.
CALLS_COVER_CYCLES = 200_000


# The streams a call runs on (docs/VERIFIER.md "Inputs"): a stream of the caller's own (a
# non-blocking torch.cuda.Stream(), made once and kept), the legacy default stream (handle 0:
# what the package's binding passes, getCurrentCUDAStream(), in a program that never makes a
# stream) and cudaStreamPerThread (handle 2). A kernel that special-cases the default streams
# meets them.
STREAM_KINDS = ("pool", "legacy", "per_thread")
PER_THREAD_HANDLE = 2  # cudaStreamPerThread


def stream_of_kind(kind: str, pool_stream):
    """The torch stream a call of `kind` runs on; `pool_stream` is the caller's own."""
    import torch

    if kind == "pool":
        return pool_stream
    if kind == "legacy":
        return torch.cuda.default_stream()  # its handle is 0
    if kind == "per_thread":  # (an even handle: torch takes it for an external stream, as it is)
        return torch.cuda.ExternalStream(PER_THREAD_HANDLE)
    raise ValueError(f"unknown stream kind {kind!r} (one of {', '.join(STREAM_KINDS)})")


def thread_streams(pool: list, count: int, kind: str = "pool") -> list:
    """The streams of `count` host threads calling at once: each a stream of `pool` of its own, or
    for "legacy" / "per_thread" every thread the same handle (0, or cudaStreamPerThread's 2: the
    handle is shared, the per-thread stream behind it is each thread's), as every thread of a
    program that never makes a stream calls on (a Flask/FastAPI worker, a thread-pool harness)."""
    if kind == "pool":
        return streams_from(pool, count)
    return [stream_of_kind(kind, None)] * count


def streams_from(pool: list, count: int) -> list:
    """`count` streams of `pool`, made when first needed and kept (as a caller's streams are)."""
    import torch

    while len(pool) < count:
        pool.append(torch.cuda.Stream())
    return pool[:count]


def launch_side_by_side(launchers: list[Callable[[], int]], streams: list, leads: list[int]) -> int:
    """Calls that run at the same time, call i on streams[i], as two threads or two streams of a
    program call an op: one spin on streams[0] covers the host's launches, an event releases
    every stream at once, then stream i waits leads[i] more cycles (a shorter lead starts first).
    Returns the first failing call's code or 0; does not wait for the device."""
    import torch

    torch.cuda.synchronize()
    go = torch.cuda.Event()
    with torch.cuda.stream(streams[0]):
        torch.cuda._sleep(CALLS_COVER_CYCLES)
        go.record(streams[0])
    for stream, lead in zip(streams, leads):
        if stream is not streams[0]:
            stream.wait_event(go)
        if int(lead) > 0:
            with torch.cuda.stream(stream):
                torch.cuda._sleep(int(lead))
    codes = [launch() for launch in launchers]
    return next((code for code in codes if code), 0)


# Device cycles the legacy default stream spins while a call is checked for work left off its
# stream (about 2 ms, far longer than the launch-bound and budget-sized calls it is run on): work
# launched on the legacy or the per-thread default stream (handles that need no stream-creating
# symbol) waits behind it, so it cannot finish before `stream` does.
HOLD_DEFAULT_STREAM_CYCLES = 4_000_000


def launch_then_copy(launch: Callable[[], int], stream, copies: list) -> int:
    """One call on `stream` with the default streams held busy, then on `stream` right after it
    each (source, destination) copy of `copies`: what a caller's next op on `stream` reads. Work
    the call left on another stream is unfinished there. Returns the call's code; does not wait."""
    import torch

    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.default_stream()):
        torch.cuda._sleep(HOLD_DEFAULT_STREAM_CYCLES)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(CALLS_COVER_CYCLES)  # the host launches the call meanwhile
        code = launch()
        for source, destination in copies:
            destination.copy_(source)
    return code


def call_from_threads(launchers: list[list[Callable[[], int]]], repeat: int, streams: list | None = None
                      ) -> tuple[int, int | None]:
    """Calls from host threads at the same time, as a multi-threaded server or nn.DataParallel
    makes them: thread i makes `repeat` calls in a row through launchers[i] (in turn, one call
    each), all threads released together by a barrier, then (on a GPU) waits for streams[i].
    ctypes lets go of the GIL inside the library, so the threads' calls run through the kernel's
    host code at the same time. Returns (the first failing code, its thread) or (0, None); an
    exception in a thread (a CUDA error at its stream's synchronize) is raised here."""
    import threading

    gate = threading.Barrier(len(launchers))
    codes: list[int] = [0] * len(launchers)
    errors: list[BaseException | None] = [None] * len(launchers)

    def run(index: int) -> None:
        try:
            if streams is not None:
                import torch

                torch.cuda.set_device(streams[index].device)  # a new thread's current device is device 0
            mine = launchers[index]
            gate.wait()
            for number in range(repeat):
                code = mine[number % len(mine)]()
                if code:
                    codes[index] = code
                    break
            if streams is not None:
                streams[index].synchronize()
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
            errors[index] = error
            gate.abort()

    if streams is not None:
        import torch

        torch.cuda.synchronize()
    threads = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(len(launchers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    raised = [e for e in errors if e is not None]
    if raised:
        raise next((e for e in raised if not isinstance(e, threading.BrokenBarrierError)), raised[0])
    failed = next((index for index, code in enumerate(codes) if code), None)
    return (0, None) if failed is None else (codes[failed], failed)


class _NativeJob(ctypes.Structure):
    """What one native thread calls (threaded.DRIVER_SOURCE's `Job`, field for field)."""

    _fields_ = [("entry", ctypes.c_void_p), ("size", ctypes.c_void_p), ("args", ctypes.c_void_p),
                ("count", ctypes.c_int64), ("stream", ctypes.c_void_p), ("repeat", ctypes.c_int64),
                ("workspace_at", ctypes.c_int64), ("bytes_at", ctypes.c_int64), ("placed", ctypes.c_void_p),
                ("have", ctypes.c_uint64), ("code", ctypes.c_int32), ("failed_call", ctypes.c_int32),
                ("asked", ctypes.c_uint64)]


def call_from_native_threads(driver: str, lib, threads: list[list[dict]], repeat: int, streams: list
                             ) -> tuple[int, int | None]:
    """call_from_threads from native threads (threaded.DRIVER_SOURCE, compiled by the judge: `driver` is
    its library): thread i makes `repeat` calls of threads[i] in turn (call dicts: direction, tensors
    with the thread's workspace, scalars, dims) on streams[i], with no GIL between its calls. Each
    call asks the size function first, as KernelLibrary.launcher does. Returns (the first failing
    code, its thread) or (0, None); does not wait for the device. (Streams that are no torch
    streams, a CPU stand-in runner's handles, are passed as they are, for host-only test libraries.)"""
    from .. import abi
    from .library import WORKSPACE_SHORT, shortfall

    native = ctypes.CDLL(driver)
    native.specgen_call_from_threads.restype = ctypes.c_int
    native.specgen_call_from_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
    keep, jobs = [], (_NativeJob * len(threads))()
    for job, calls, stream in zip(jobs, threads, streams):
        structs = []
        for call in calls:
            args = abi.pack_args(lib.spec, call["direction"], call["tensors"], call["scalars"], call["dims"])
            abi.set_workspace(args, call["tensors"].get(abi.WORKSPACE))
            structs.append(args)
        direction, placed = calls[0]["direction"], calls[0]["tensors"].get(abi.WORKSPACE)
        addresses = (ctypes.c_void_p * len(structs))(*[ctypes.addressof(s) for s in structs])
        keep += [structs, addresses]
        size = getattr(lib.lib, abi.workspace_function(lib.spec, direction), None)
        kind = type(structs[0])
        job.entry = ctypes.cast(lib.entry(direction), ctypes.c_void_p).value
        job.size = None if size is None else ctypes.cast(size, ctypes.c_void_p).value
        job.args, job.count = ctypes.addressof(addresses), len(structs)
        job.stream, job.repeat = stream.cuda_stream or None, repeat
        job.workspace_at, job.bytes_at = kind.workspace.offset, kind.workspace_bytes.offset
        job.placed = placed.data_ptr() if placed is not None and placed.numel() else None
        job.have = 0 if placed is None else placed.numel()
    import torch

    if any(isinstance(stream, torch.cuda.Stream) for stream in streams):
        torch.cuda.synchronize()
    if native.specgen_call_from_threads(ctypes.addressof(jobs), len(threads)) != 0:
        raise RuntimeError("the threads driver could not start its threads")
    failed = next((index for index, job in enumerate(jobs) if job.code), None)
    if failed is None:
        return 0, None
    if jobs[failed].code == WORKSPACE_SHORT:
        lib.short = shortfall(jobs[failed].asked, jobs[failed].have)
    return jobs[failed].code, failed
