"""The candidate's process: it loads one kernel library and runs it when the judge asks.

It holds no checking code: no reference, no comparison, no verdict. It sees the inputs
through a read-only mapping and writes the outputs into memory the judge reads. Whatever
a kernel's load-time code does to this process, it can only lie through the outputs (which
the judge checks) and through what this process reports (return codes, the graph capture's
outcome, event timings: see docs/VERIFIER.md for what that leaves open).

Run as `python -m specgen.verify.candidate_main SOCKET_FD`; messages: specgen.verify.channel.

It also reports one thing about itself: its calling threads' floating-point environment (the
last section), read before and after every request's calls, so the judge can reject host code
that leaves it changed (host-state-changed).
"""
from __future__ import annotations

import ctypes
import functools
import os
import socket
import sys
import time
import traceback


def serve(fd: int) -> int:
    from .channel import Channel, ChannelClosed

    channel = Channel(socket.socket(fileno=fd))
    try:
        import torch

        from .arena import Arena
        from .graphs import stream_of_kind
        from .layout import view
        from .local_memory import resident_threads, stack_limit, stack_report
        from .pending_error import PENDING_KEY, pending_report
        from .pool import keep_freed_memory, reset_peak

        torch.empty(1, device="cuda")
        device = torch.cuda.current_device()
        stream = torch.cuda.Stream()
        keep_freed_memory(device)  # per-call workspaces reused, as in the package (pool.py)
        stack_baseline = stack_limit()  # the context's per-thread stack before any kernel (local_memory.py)
        threads_resident = resident_threads(torch, device)
    except Exception:  # noqa: BLE001 - reported to the judge, which decides
        channel.send({"type": "error", "message": traceback.format_exc()})
        return 1
    channel.send({"type": "ready", "device": torch.cuda.get_device_name()})
    state = {"arenas": {}, "lib": None, "spec": None, "flush": None, "streams": []}

    def tensors(refs: dict) -> dict:
        from .layout import TensorRef

        return {name: view(state["arenas"][ref[0]][1], TensorRef.from_json(ref)) for name, ref in refs.items()}

    def call(message: dict, on_stream) -> int:
        return prepare_call(message, on_stream)()

    def prepare_call(message: dict, on_stream):
        return state["lib"].launcher(message["direction"], tensors(message["tensors"]), message.get("scalars", {}),
                                     message.get("dims", {}), on_stream)

    while True:
        try:
            received = channel.receive()
        except ChannelClosed:
            return 0
        message, fds = received
        op = message["op"]
        fp_saved = fp_save()  # this thread's floating-point environment (fp_report)
        fp_before = fp_state(fp_saved)
        thread_before = thread_state() if op in THREAD_CHECKED else None
        pool_before = pool_in_use(torch, device) if op in LEAK_CHECKED else None
        if pool_before is not None:
            reset_peak(device)  # the pool's high-water mark from here (scratch parked in the pool)
        try:
            if op == "arenas":
                for (name, nbytes, readonly), fd_ in zip(message["arenas"], fds):
                    old = state["arenas"].pop(name, None)
                    if old is not None:
                        old[0].close()
                    arena = Arena.attach(fd_, nbytes, device, readonly=readonly)
                    state["arenas"][name] = (arena, arena.tensor())
                reply = {"type": "ok"}
            elif op == "far_arenas":  # (version 16) tensors GiB apart in one sparse arena (far_inputs.py)
                from .sparse_arena import serve_far_arenas

                reply = serve_far_arenas(state["arenas"], message, fds, device)  # ok, or refused (not fatal)
            elif op == "load":
                from ..spec import load_spec
                from .library import KernelLibrary

                state["spec"] = load_spec(message["spec"])
                state["lib"] = KernelLibrary(state["spec"], message["library"])  # load-time code runs here
                reply = {"type": "ok", "entries": [d for d in ("forward", "backward") if state["lib"].has(d)],
                         "sized": state["lib"].sized()}
            elif op == "workspace":  # the size function's answers; the judge decides what they are worth
                reply = {"type": "ok", "sizes": [state["lib"].workspace_bytes(
                    c["direction"], tensors(c["tensors"]), c.get("scalars", {}), c.get("dims", {}))
                    for c in message["calls"]]}
            elif op == "call":  # on the stream kind the judge asks for (graphs.STREAM_KINDS)
                on_stream = stream_of_kind(message.get("stream", "pool"), stream)
                torch.cuda.synchronize()
                started = time.perf_counter()
                code = call(message, on_stream)
                host_ms = (time.perf_counter() - started) * 1e3
                reply = _after(torch, state, {"type": "done", "code": code, "host_ms": host_ms})
            elif op == "starved_call":  # one call with every cudaMallocAsync failing (pool.StarvedPool)
                from .pool import StarvedPool

                on_stream = stream_of_kind(message.get("stream", "pool"), stream)
                torch.cuda.synchronize()
                with StarvedPool(device) as starved:
                    if starved.problem:
                        reply = {"type": "done", "code": 0, "skipped": starved.problem}
                    else:
                        reply = _after(torch, state, {"type": "done", "code": call(message, on_stream)})
                        state["lib"].clear_error()  # a failed allocation it ignored: not the next call's error
            elif op == "dirty_call":  # one call after the default pool was left dirty by another user (dirty_pool.py)
                from .dirty_pool import dirty_default_pool

                on_stream = stream_of_kind(message.get("stream", "pool"), stream)
                torch.cuda.synchronize()
                if problem := dirty_default_pool(device, on_stream.cuda_stream, int(message.get("seed", 0))):
                    reply = {"type": "done", "code": 0, "skipped": problem}
                else:
                    reply = _after(torch, state, {"type": "done", "code": call(message, on_stream)})
            elif op == "capture":
                reply = _capture(torch, state, message, call)
            elif op == "replay":
                torch.cuda.synchronize()
                state["graph"].replay()
                reply = _after(torch, state, {"type": "done", "code": 0})
            elif op == "endure":
                reply = _endure(torch, state, message, prepare_call, stream)
            elif op in ("thread_exit", "new_addresses"):  # (version 16) the heap over threads / new addresses
                from . import new_addresses, thread_exit

                served = thread_exit.serve if op == "thread_exit" else new_addresses.serve
                reply = _after(torch, state, served(message, prepare_call,
                                                    stream_of_kind(message.get("stream", "legacy"), stream)))
            elif op == "timed":
                on_stream = stream_of_kind(message.get("stream", "pool"), stream)
                reply = _timed(torch, state, message, prepare_call, on_stream, tensors)
            elif op == "side_by_side":
                reply = _side_by_side(torch, state, message, prepare_call)
            elif op == "threads":
                reply = _threads(torch, state, message, prepare_call, tensors)
            elif op == "then_copy":
                from .graphs import launch_then_copy

                pairs = [(tensors({"s": s_})["s"], tensors({"d": d_})["d"]) for s_, d_ in message["copies"]]
                code = launch_then_copy(prepare_call(message, stream), stream, pairs)
                reply = _after(torch, state, {"type": "done", "code": code})
            else:
                reply = {"type": "error", "message": f"unknown op {op!r}"}
        except Exception as error:  # noqa: BLE001 - a broken context is fatal; the judge decides
            text = str(error).strip().splitlines()
            oom = "out of memory" in str(error).lower()
            reply = {"type": "fatal" if "cuda" in str(error).lower() and not oom else "error",
                     "message": text[0] if text else type(error).__name__, "trace": traceback.format_exc()[-2000:]}
        if state["lib"] is not None and (pending := pending_report(state["lib"], op, reply)) is not None:
            reply[PENDING_KEY] = pending  # a call returned success with a CUDA error left pending (pending_error.py)
        if (changed := fp_report(fp_before, fp_saved)) is not None:  # the calls this thread made left it changed
            reply["host_fp"] = [changed, *reply.get("host_fp", [])]
        if thread_before is not None and (moved := thread_report(thread_before)) is not None:  # CPUs, priority, signals
            reply["host_thread"] = moved
        if pool_before is not None and reply.get("type") in ("done", "timed"):  # (the timed calls answer "timed")
            after = pool_in_use(torch, device)
            if after is not None and after > pool_before:  # cudaMallocAsync memory the calls never freed
                reply["leaked"] = {"bytes": after - pool_before, "op": op}
            if (parked := parked_in_pool(device, pool_before, op)) is not None:  # freed, but kept by the pool
                reply["parked"] = parked
        if op != "arenas" and reply.get("type") not in ("fatal", "error"):
            # (the judge reads the arenas' reply itself, not through IsolatedRunner._request)
            last = state.get("stack_last", stack_baseline)
            if (grown := stack_report(stack_limit(), last, stack_baseline, threads_resident, op)) is not None:
                reply["local_memory"] = grown  # reported as it grows (it never shrinks); the judge decides
                state["stack_last"] = grown["stack_bytes"]
        channel.send(reply)
        if reply["type"] == "fatal":
            return 0  # the CUDA context is unusable: this process is done


def _after(torch, state, reply: dict) -> dict:
    """Wait for the whole device; a launch failure or an illegal address ends this process."""
    try:
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001
        lines = str(error).strip().splitlines()
        return {"type": "fatal", "message": lines[0] if lines else type(error).__name__, **reply}
    if reply.get("code"):
        reply["error"] = state["lib"].error_name(reply["code"])
        state["lib"].clear_error()
    return reply


def _capture(torch, state, message: dict, call) -> dict:
    """Capture one call into a CUDA graph on a fresh stream (kept for `replay`)."""
    from .graphs import capture_one_call

    try:
        graph, code, problem = capture_one_call(lambda stream: call(message, stream))
    except Exception as error:  # noqa: BLE001 - capture_begin failed: before the kernel ran
        return {"type": "error", "message": f"capture_begin failed: {error}"}
    state["lib"].clear_error()
    if graph is None:
        try:
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001
            return {"type": "fatal", "message": str(error).strip().splitlines()[0]}
        error_name = state["lib"].error_name(code) if code else None
        return {"type": "captured", "ok": False, "code": code, "error": error_name, "problem": problem}
    state["graph"] = graph
    return _after(torch, state, {"type": "captured", "ok": True, "code": 0})


def _endure(torch, state, message: dict, prepare_call, stream) -> dict:
    """The same call many times (graphs.repeat_calls), then the device's state."""
    from .graphs import repeat_calls
    from .host_memory import growth_report, heap_in_use

    heap_before = heap_in_use()  # the malloc heap around the run: host memory the calls leak (host_memory.py)
    code, problem = repeat_calls(lambda on_stream: prepare_call(message, on_stream), stream,
                                 host_calls=int(message["host_calls"]), graph_calls=int(message["graph_calls"]),
                                 replays=int(message["replays"]))
    heap = growth_report(heap_before, heap_in_use(), int(message["host_calls"]))
    state["lib"].clear_error()  # the name of `code` is looked up from the code itself
    reply = {"type": "done", "code": code}
    if heap is not None:
        reply["host_heap"] = heap
    if problem is not None:
        reply.update(ok=False, problem=problem)
    return _after(torch, state, reply)


def _side_by_side(torch, state, message: dict, prepare_call) -> dict:
    """Calls at the same time, each on a stream of its own (graphs.launch_side_by_side); the
    streams are made once and kept, as `stream` is."""
    from .graphs import launch_side_by_side, streams_from

    calls = message["calls"]
    streams = streams_from(state["streams"], len(calls))
    launches = [prepare_call(item, on) for item, on in zip(calls, streams)]
    code = launch_side_by_side(launches, streams, message.get("leads") or [0] * len(calls))
    return _after(torch, state, {"type": "done", "code": code})


def _threads(torch, state, message: dict, prepare_call, tensors) -> dict:
    """Calls from host threads at the same time: thread i, on a stream of its own (made once and
    kept, as side_by_side's) or all on one handle (message "stream": graphs.thread_streams),
    makes `repeat` calls in turn through its list of calls (each its own outputs); from native
    threads when the judge sends the driver it compiled (graphs.call_from_native_threads), else
    from Python threads (graphs.call_from_threads). The failing call's thread is `failed_call`."""
    from .graphs import call_from_native_threads, call_from_threads, thread_streams

    threads, repeat = message["threads"], int(message["repeat"])
    streams = thread_streams(state["streams"], len(threads), message.get("stream", "pool"))
    native = message.get("driver")
    if native:
        resolved = [[{**item, "tensors": tensors(item["tensors"]), "scalars": item.get("scalars", {}),
                      "dims": item.get("dims", {})} for item in calls] for calls in threads]
        try:
            code, failed = call_from_native_threads(native, state["lib"], resolved, repeat, streams)
            reports = native_fp_reports(native, len(threads))  # each pthread's environment around its calls
        except OSError:  # the driver would not load here: Python threads
            native = None
    if not native:
        launchers, watches = watch_threads([[prepare_call(item, on) for item in calls]
                                            for calls, on in zip(threads, streams)])
        code, failed = call_from_threads(launchers, repeat, streams)
        reports = [watch.report(index + 1) for index, watch in enumerate(watches) if watch.change]
    reply = {"type": "done", "code": code}
    if failed is not None:
        reply["failed_call"] = failed
    if reports:
        reply["host_fp"] = reports
    return _after(torch, state, reply)


# Device cycles the stream spins before each timed call's start event (about 40 us at the
# H200's 1.98 GHz): the host launches the call meanwhile, so the events time the kernel's device
# work and not the host's launch latency (measured on the H200: with the device idle at the
# start event, a 37 us kernel timed at 106 us). Baselines are timed the same way: a flush
# queued before their start event keeps the device busy while they launch.
LAUNCH_COVER_CYCLES = 80_000


def _timed(torch, state, message: dict, prepare_call, stream, tensors) -> dict:
    """Calls as a benchmark makes them: before each (outside the timed events) its outputs are
    poisoned and the L2 is flushed; CUDA events around each call on `stream`, and the host's time
    from an idle device to idle again (work left on another stream shows as the difference)."""
    flush_bytes = int(message.get("flush_bytes", 0))
    if flush_bytes and (state["flush"] is None or state["flush"].numel() < flush_bytes):
        state["flush"] = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
    calls = message["calls"]
    launches = [prepare_call(item, stream) for item in calls]  # views and argument structs, untimed
    events, walls = [], []
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for index, (item, launch) in enumerate(zip(calls, launches)):
            for ref in item.get("poison", []):  # uint8 refs over each output's bytes
                tensors({"p": ref})["p"].random_(0, 256)
            if state["flush"] is not None:
                state["flush"][:flush_bytes].zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(LAUNCH_COVER_CYCLES)  # on `stream`: busy while the host launches
            began = time.perf_counter()
            start.record(stream)
            code = launch()
            end.record(stream)
            torch.cuda.synchronize()  # every stream: the call's work wherever it was launched
            walls.append((time.perf_counter() - began) * 1e3)
            events.append((start, end))
            if code:
                return _after(torch, state, {"type": "timed", "code": code, "failed_call": index, "times_ms": []})
    reply = _after(torch, state, {"type": "timed", "code": 0, "times_ms": []})
    if reply["type"] == "timed":
        reply["times_ms"] = [s.elapsed_time(e) for s, e in events]
        reply["walls_ms"] = walls
    return reply


# ------------------------------------------------------------------ memory the calls leave allocated
# (verifier version 12) A call may take scratch from the device's default pool (cudaMallocAsync on
# `stream`) but must give it back (cudaFreeAsync on `stream`): memory allocated by a call and never
# freed grows without bound in a generation loop, one call per token, until the process runs out of
# GPU memory (held-out attacks-v9's softmax: its few-rows schedule never freed its scratch, session 34).
# The pool's bytes in use are read before and after every request that calls the kernel (the device
# idle both times); a growth is `leaked-memory`. Captures, replays and the endurance run (which
# replays graphs) are left out: a capture's allocations belong to the graph.
LEAK_CHECKED = ("call", "timed", "side_by_side", "threads", "then_copy")


def pool_in_use(torch, device: int) -> int | None:
    """The default pool's bytes in use on `device` once the device is idle (pool.used_bytes)."""
    from .pool import used_bytes

    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a lost context is the request's own business
        return None
    return used_bytes(device)


def parked_in_pool(device: int, before: int, op: str) -> dict | None:
    """(verifier version 13) The scratch a request took from the default pool at its peak above the
    `before` bytes in use (pool.parked_report; the judge holds it to pool.PARKED_BYTES_LIMIT); the pool
    keeps it reserved after it is freed, where PyTorch's allocator cannot use it."""
    from .pool import parked_report, peak_bytes

    return parked_report(before, peak_bytes(device), op)


# ------------------------------------------------------------------ the calling thread's scheduling state
# (verifier version 12) The CPUs a thread may run on, its nice value, its scheduling policy and its
# blocked signals belong to the caller's thread, as its floating-point environment does: host code
# that pins the calling thread to one core (to keep its launches on the GPU's NUMA node) and leaves
# it pinned serializes the caller's data loader, tokenizer and CPU ops on that core from then on,
# and no output shows it (held-out attacks-v9's gelu_tanh, session 34). Read before and after each
# request in the thread the requests come in on; a change is put back and reported.


# Only the requests that run the kernel's code and little else: torch's own CPU work in the others
# (an OpenMP runtime that binds its first parallel region's thread under OMP_PROC_BIND) is not the
# kernel's doing.
THREAD_CHECKED = ("load", "workspace", "call", "starved_call")


def thread_state() -> dict:
    """The calling thread's CPU affinity, nice value, scheduling policy and blocked signals (Linux:
    each call with pid 0 reads the calling thread); {} where the platform has none of them."""
    import signal

    state = {}
    if hasattr(os, "sched_getaffinity"):
        state["cpus"] = sorted(os.sched_getaffinity(0))
    if hasattr(os, "getpriority"):
        state["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    if hasattr(os, "sched_getscheduler"):
        state["policy"] = os.sched_getscheduler(0)
    if hasattr(signal, "pthread_sigmask"):
        state["blocked signals"] = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    return state


def thread_report(before: dict) -> dict | None:
    """None when the calling thread's thread_state is still `before`; else {"before", "after"}, with
    what can be put back put back (raising a lowered priority again may need privileges: skipped)."""
    import signal

    after = thread_state()
    if after == before:
        return None
    try:
        if "cpus" in before and after.get("cpus") != before["cpus"]:
            os.sched_setaffinity(0, before["cpus"])
        if "blocked signals" in before and after.get("blocked signals") != before["blocked signals"]:
            signal.pthread_sigmask(signal.SIG_SETMASK, before["blocked signals"])
        if "nice" in before and after.get("nice") != before["nice"]:
            os.setpriority(os.PRIO_PROCESS, 0, before["nice"])
    except OSError:
        pass
    return {"before": before, "after": after}


def thread_change_detail(before: dict, after: dict, by: str) -> str:
    """The words of a host-state-changed verdict for the calling thread's scheduling state."""
    changed = [f"its {name} {before.get(name)} before, {after.get(name)} after"
               for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]
    return (f"the calling host thread's scheduling state changed by {by}, left so: {'; '.join(changed)}. An entry "
            f"point runs in the caller's thread: pinning it to CPUs, changing its priority or policy, or blocking "
            f"signals there and leaving it so moves the caller's own work (its data loader, tokenizer, CPU ops, "
            f"and the threads it starts later, which inherit it); a call may change these only while it runs "
            f"and must put them back before returning")


# ------------------------------------------------------------------ the host's floating-point environment
# (verifier version 10) A kernel's entry points run in the caller's thread: host code that sets
# flush-to-zero and denormals-are-zero (MXCSR FTZ/DAZ on x86-64, FPCR.FZ on aarch64), a rounding
# mode or an exception trap and leaves it set changes the caller's own CPU float math from then on
# (NumPy, PyTorch's CPU ops, a CPU optimizer; threads started later inherit it), the crtfastmath
# bug of -ffast-math shared libraries. The GPU's outputs stay exact, so no output shows it (held-out
# attacks-v8's gelu_tanh). This process reads the environment of each thread that calls the kernel
# before and after its calls and reports a change; the judge rejects (host-state-changed). Read
# through glibc's fegetenv (the calling thread's own registers: MXCSR and the x87 control word on
# x86-64, FPCR on aarch64); elsewhere float arithmetic tells DAZ, FTZ and the rounding mode.

FENV_BYTES = 64  # room for a fenv_t (32 bytes in glibc on x86-64, 8 on aarch64)
MXCSR_CONTROL = 0xFFC0  # MXCSR without its sticky exception flags (bits 0-5), which any float math sets
X87_CONTROL = 0x1F3F  # the x87 control word's exception masks, precision and rounding control
FPCR_CONTROL = 0xFFFFFFFF  # FPCR (its status flags are FPSR's)

_TINY, _MIN_NORMAL, _ONE, _TWO = 5e-324, 2.2250738585072014e-308, 1.0, 2.0
_NUDGE = 0.75 * 2.0 ** -52  # three quarters of 1.0's ulp: 1 + _NUDGE rounds up to nearest and up, to 1 otherwise


@functools.lru_cache(maxsize=1)
def _libm():
    """(libm, layout) where glibc's fegetenv and fesetenv are there and fenv_t's layout is known
    (x86_64, aarch64); (None, None) elsewhere (fp_state then probes with float arithmetic)."""
    import platform

    layout = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
        platform.machine().lower())
    if layout is None:
        return None, None
    try:
        libm = ctypes.CDLL("libm.so.6")
        for name in ("fegetenv", "fesetenv"):
            getattr(libm, name).argtypes, getattr(libm, name).restype = [ctypes.c_void_p], ctypes.c_int
    except (OSError, AttributeError):
        return None, None
    return libm, layout


def _probe() -> str:
    """DAZ, FTZ and the rounding mode of this thread, told by float arithmetic on module globals
    (never folded at compile time): a subnormal times one is zero under DAZ, the smallest normal
    halved is zero under FTZ, and 1 + 3/4 ulp and -1 - 3/4 ulp round apart by mode."""
    daz = _TINY * _ONE == 0.0
    ftz = _MIN_NORMAL / _TWO == 0.0
    rounding = {(True, True): "nearest", (True, False): "up", (False, True): "down", (False, False): "zero"}[
        (_ONE + _NUDGE != _ONE, -_ONE - _NUDGE != -_ONE)]
    return " ".join([*(["DAZ"] if daz else []), *(["FTZ"] if ftz else []), rounding])


def fp_state(saved=None) -> dict:
    """The calling thread's floating-point environment, as comparable JSON: {"mxcsr", "x87"} on
    x86-64, {"fpcr"} on aarch64 (control bits only), else {"probe": "DAZ FTZ nearest"}. `saved`: an
    environment fp_save just took in this thread, read instead of taking another."""
    libm, layout = _libm()
    if libm is not None:
        env = saved if saved is not None else fp_save()
        if env is not None:
            raw = bytes(env)
            if layout == "x86_64":
                return {"mxcsr": int.from_bytes(raw[28:32], "little") & MXCSR_CONTROL,
                        "x87": int.from_bytes(raw[0:2], "little") & X87_CONTROL}
            return {"fpcr": int.from_bytes(raw[0:4], "little") & FPCR_CONTROL}
    return {"probe": _probe()}


def fp_save():
    """The calling thread's whole floating-point environment (fegetenv), for fp_restore; None
    where it cannot be saved."""
    libm, _ = _libm()
    if libm is None:
        return None
    env = (ctypes.c_uint8 * FENV_BYTES)()
    return env if libm.fegetenv(env) == 0 else None


def fp_restore(saved) -> None:
    """Put back what fp_save saved, in the calling thread (fesetenv: MXCSR whole, DAZ and FTZ
    included, and the x87 environment; FPCR on aarch64)."""
    libm, _ = _libm()
    if libm is not None and saved is not None:
        libm.fesetenv(saved)


def fp_report(before: dict, saved) -> dict | None:
    """After a request's calls from this thread: None when its floating-point environment is
    still `before`; else the change ({"thread": 0, "before", "after"}: 0 is the thread the
    requests come in on), and the environment put back as `saved` (fp_save) had it."""
    after = fp_state()
    if after == before:
        return None
    fp_restore(saved)
    return {"thread": 0, "before": before, "after": after}


class ThreadFpWatch:
    """One Python thread's floating-point environment around its calls: read at its first call
    (a new thread starts with its creator's) and after each call; the first change is kept."""

    def __init__(self):
        self.before: dict | None = None
        self.calls = 0
        self.change: dict | None = None  # {"call": index, "before", "after"}

    def wrap(self, launch):
        def watched() -> int:
            if self.before is None:
                self.before = fp_state()
            try:
                return launch()
            finally:
                if self.change is None and (after := fp_state()) != self.before:
                    self.change = {"call": self.calls, "before": self.before, "after": after}
                self.calls += 1
        return watched

    def report(self, thread: int) -> dict:
        return {"thread": thread, **self.change}


def watch_threads(launchers: list[list]) -> tuple[list[list], list[ThreadFpWatch]]:
    """graphs.call_from_threads' launchers, each thread's wrapped in a ThreadFpWatch of its own."""
    watches = [ThreadFpWatch() for _ in launchers]
    return [[watch.wrap(launch) for launch in mine] for watch, mine in zip(watches, launchers)], watches


def native_fp_reports(driver: str, count: int) -> list[dict]:
    """The changes the threads driver (threaded.DRIVER_SOURCE) saw in its last run's pthreads: each
    thread's environment read after the barrier and after each call (MXCSR and the x87 control
    word, or FPCR), as fp_state has them; [] where the driver cannot read it (another CPU)."""
    native = ctypes.CDLL(driver)
    query = getattr(native, "specgen_thread_fp_env", None)
    if query is None:
        return []
    query.restype, query.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]
    reports, seen = [], (ctypes.c_int64 * 3)()
    for index in range(count):
        kind = query(index, seen)
        if kind == 0:
            return []
        before, after, call = seen
        if call >= 0:
            reports.append({"thread": index + 1, "call": call, "before": _native_state(kind, before),
                            "after": _native_state(kind, after)})
    return reports


def _native_state(kind: int, value: int) -> dict:
    value &= (1 << 64) - 1
    if kind == 1:  # x86-64: MXCSR in the low half, the x87 control word above
        return {"mxcsr": value & MXCSR_CONTROL, "x87": (value >> 32) & X87_CONTROL}
    return {"fpcr": value & FPCR_CONTROL}


_ROUNDING_X86 = ("to nearest", "down (toward -inf)", "up (toward +inf)", "toward zero")  # RC 00, 01, 10, 11
_ROUNDING_ARM = ("to nearest", "up (toward +inf)", "down (toward -inf)", "toward zero")  # RMode 00, 01, 10, 11
_ROUNDING_PROBE = {"nearest": "to nearest", "up": "up (toward +inf)", "down": "down (toward -inf)",
                   "zero": "toward zero"}
CALLER = "the caller's CPU float math would "
_TRAPS_X86 = ("invalid operation", "denormal operand", "divide-by-zero", "overflow", "underflow", "inexact")
_TRAPS_ARM = ((8, "invalid operation"), (9, "divide-by-zero"), (10, "overflow"), (11, "underflow"), (12, "inexact"),
              (15, "input denormal"))
_PRECISION_X87 = {0: "single", 2: "double", 3: "extended"}
FLUSH_WORDS = "the caller's CPU float math would flush subnormals"


def fp_change_words(before: dict, after: dict) -> tuple[list[str], list[str], bool]:
    """What changed between two fp_state()s, in words: (the changes, their effects on the
    caller's float math, whether every change is a bit set)."""
    changes: list[str] = []
    effects: list[str] = []
    only_set = True

    def flags(register: str, named: list[tuple[int, str]], b: int, a: int, effect_set: str, effect_clear: str):
        nonlocal only_set
        on = [name for bit, name in named if a >> bit & 1 and not b >> bit & 1]
        off = [name for bit, name in named if b >> bit & 1 and not a >> bit & 1]
        if on:
            changes.append(f"{register} {' and '.join(on)} set".strip())
            effects.append(effect_set)
        if off:
            only_set = False
            changes.append(f"{register} {' and '.join(off)} cleared".strip())
            effects.append(effect_clear)

    def rounding(register: str, names, b: int, a: int):
        nonlocal only_set
        if a != b:
            only_set = False
            changes.append(f"{register} rounding mode changed from round {names[b]} to round {names[a]}")
            effects.append(f"the caller's CPU float math would round {names[a]}")

    def traps(register: str, named, b_enabled: set, a_enabled: set):
        nonlocal only_set
        if a_enabled - b_enabled:
            only_set = False
            shown = ", ".join(n for _, n in named if n in a_enabled - b_enabled)
            changes.append(f"{register} exception traps enabled ({shown})")
            effects.append(f"the caller's CPU float math would raise SIGFPE on {shown}")
        if b_enabled - a_enabled:
            only_set = False
            changes.append(f"{register} exception traps disabled "
                           f"({', '.join(n for _, n in named if n in b_enabled - a_enabled)})")
            effects.append("the caller's CPU float math would no longer trap as it was set up to")

    unflush = "the caller's CPU float math would no longer flush subnormals as it was set up to"
    if "mxcsr" in before and "mxcsr" in after:
        b, a = before["mxcsr"], after["mxcsr"]
        flags("MXCSR", [(15, "FTZ"), (6, "DAZ")], b, a, FLUSH_WORDS, unflush)
        rounding("MXCSR", _ROUNDING_X86, b >> 13 & 3, a >> 13 & 3)
        named = list(enumerate(_TRAPS_X86, 7))
        traps("MXCSR", named, {n for bit, n in named if not b >> bit & 1}, {n for bit, n in named if not a >> bit & 1})
        b, a = before["x87"], after["x87"]
        if (b >> 8 & 3) != (a >> 8 & 3):
            only_set = False
            changes.append(f"x87 precision changed from {_PRECISION_X87.get(b >> 8 & 3, 'reserved')} to "
                           f"{_PRECISION_X87.get(a >> 8 & 3, 'reserved')}")
            effects.append("the caller's long double math would round to another precision")
        rounding("x87", _ROUNDING_X86, b >> 10 & 3, a >> 10 & 3)
        named = list(enumerate(_TRAPS_X86))
        traps("x87", named, {n for bit, n in named if not b >> bit & 1}, {n for bit, n in named if not a >> bit & 1})
    elif "fpcr" in before and "fpcr" in after:
        b, a = before["fpcr"], after["fpcr"]
        flags("FPCR", [(24, "FZ"), (19, "FZ16"), (0, "FIZ")], b, a, FLUSH_WORDS, unflush)
        flags("FPCR", [(25, "DN")], b, a, "the caller's CPU float math would return the default NaN for every NaN",
              "the caller's CPU float math would no longer return the default NaN as it was set up to")
        rounding("FPCR", _ROUNDING_ARM, b >> 22 & 3, a >> 22 & 3)
        traps("FPCR", _TRAPS_ARM, {n for bit, n in _TRAPS_ARM if b >> bit & 1},
              {n for bit, n in _TRAPS_ARM if a >> bit & 1})
    elif "probe" in before and "probe" in after:
        b, a = before["probe"].split(), after["probe"].split()
        flags("", [(1, "FTZ"), (0, "DAZ")], ("FTZ" in b) << 1 | ("DAZ" in b), ("FTZ" in a) << 1 | ("DAZ" in a),
              FLUSH_WORDS, unflush)
        if b[-1] != a[-1]:
            only_set = False
            changes.append(f"the rounding mode changed from round {_ROUNDING_PROBE[b[-1]]} to round "
                           f"{_ROUNDING_PROBE[a[-1]]}")
            effects.append(f"the caller's CPU float math would round {_ROUNDING_PROBE[a[-1]]}")
    if not changes:  # bits without a name (reserved, or a layout not known here)
        only_set = False
        changes.append("the floating-point control register changed")
        effects.append("the caller's CPU float math would run under another environment")
    return changes, effects, only_set


def fp_change_detail(before: dict, after: dict, by: str) -> str:
    """The words of a host-state-changed verdict: what changed `by` whom, what it does to the
    caller, and the registers before and after."""
    changes, effects, only_set = fp_change_words(before, after)
    effects = list(dict.fromkeys(effects))
    mine = [e[len(CALLER):] for e in effects if e.startswith(CALLER)]  # one subject for the caller's float math
    rest = [e for e in effects if not e.startswith(CALLER)]
    effect = "; ".join(([CALLER + (", ".join(mine[:-1]) + " and " + mine[-1] if len(mine) > 1 else mine[0])]
                        if mine else []) + rest)
    words = {"mxcsr": "MXCSR", "x87": "x87 control word", "fpcr": "FPCR", "probe": "told by float arithmetic:"}
    registers = ", ".join(f"{words.get(name, name)} {value if name == 'probe' else hex(value)} before, "
                          f"{after.get(name) if name == 'probe' else hex(after.get(name, 0))} after"
                          for name, value in before.items() if after.get(name) != value)
    return (f"{' and '.join(changes)} by {by}, left {'set' if only_set else 'so'}: {effect}; restore the "
            f"floating-point environment before returning ({registers}, in the thread that made the call: "
            f"an entry point runs in the caller's thread, whose NumPy, PyTorch CPU ops and CPU optimizers, and "
            f"the threads it starts later, would inherit it, as -ffast-math host code built with crtfastmath "
            f"does; a call may change it only while it runs)")


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
