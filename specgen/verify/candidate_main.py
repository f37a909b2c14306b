"""The candidate's process: it loads one kernel library and runs it when the judge asks.

It holds no checking code: no reference, no comparison, no verdict. It sees the inputs
through a read-only mapping and writes the outputs into memory the judge reads. Whatever
a kernel's load-time code does to this process, it can only lie through the outputs (which
the judge checks) and through what this process reports (return codes, the graph capture's
outcome, event timings: see docs/VERIFIER.md for what that leaves open).

Run as `python -m specgen.verify.candidate_main SOCKET_FD`; messages: specgen.verify.channel.
"""
from __future__ import annotations

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
        from .pool import keep_freed_memory

        torch.empty(1, device="cuda")
        device = torch.cuda.current_device()
        stream = torch.cuda.Stream()
        keep_freed_memory(device)  # per-call workspaces reused, as in the package (pool.py)
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
        try:
            if op == "arenas":
                for (name, nbytes, readonly), fd_ in zip(message["arenas"], fds):
                    old = state["arenas"].pop(name, None)
                    if old is not None:
                        old[0].close()
                    arena = Arena.attach(fd_, nbytes, device, readonly=readonly)
                    state["arenas"][name] = (arena, arena.tensor())
                reply = {"type": "ok"}
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
            elif op == "capture":
                reply = _capture(torch, state, message, call)
            elif op == "replay":
                torch.cuda.synchronize()
                state["graph"].replay()
                reply = _after(torch, state, {"type": "done", "code": 0})
            elif op == "endure":
                reply = _endure(torch, state, message, prepare_call, stream)
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

    code, problem = repeat_calls(lambda on_stream: prepare_call(message, on_stream), stream,
                                 host_calls=int(message["host_calls"]), graph_calls=int(message["graph_calls"]),
                                 replays=int(message["replays"]))
    state["lib"].clear_error()  # the name of `code` is looked up from the code itself
    reply = {"type": "done", "code": code}
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
    kept, as side_by_side's), makes `repeat` calls in turn through its list of calls (each its own
    outputs); from native threads when the judge sends the driver it compiled
    (graphs.call_from_native_threads), else from Python threads (graphs.call_from_threads). The
    failing call's thread is `failed_call`."""
    from .graphs import call_from_native_threads, call_from_threads, streams_from

    threads, repeat = message["threads"], int(message["repeat"])
    streams = streams_from(state["streams"], len(threads))
    native = message.get("driver")
    if native:
        resolved = [[{**item, "tensors": tensors(item["tensors"]), "scalars": item.get("scalars", {}),
                      "dims": item.get("dims", {})} for item in calls] for calls in threads]
        try:
            code, failed = call_from_native_threads(native, state["lib"], resolved, repeat, streams)
        except OSError:  # the driver would not load here: Python threads
            native = None
    if not native:
        launchers = [[prepare_call(item, on) for item in calls] for calls, on in zip(threads, streams)]
        code, failed = call_from_threads(launchers, repeat, streams)
    reply = {"type": "done", "code": code}
    if failed is not None:
        reply["failed_call"] = failed
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


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
