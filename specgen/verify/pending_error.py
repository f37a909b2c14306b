"""(verifier version 16) A call that returns success with a CUDA error left pending.

Why: a CUDA runtime call that fails also records its error as the calling host thread's last
error, kept until someone reads it with cudaGetLastError. A kernel whose optional setup fails (a
persisting-L2 set-aside refused under MPS, an access-policy window, a shared-memory opt-in), that
carries on without it and returns cudaSuccess, leaves that error pending: the caller's next error
check (PyTorch's C10_CUDA_KERNEL_LAUNCH_CHECK after its next launch) raises it from an unrelated
op, the attention after rope (held-out attacks-v11's rope_a). The outputs are right, so no value
check sees it.

How: `ErrorWatch` wraps each launch of a loaded library (library.KernelLibrary.launcher), in the
thread that makes the call. Before the call it asks the runtime whether an error is pending and
clears one it finds (torch's own, or an earlier call's whose code was returned: not this call's
doing); after a call that returned 0 it asks again (cudaPeekAtLastError) and a pending error is
recorded and cleared (cudaGetLastError), so the watch never cascades into the next call. The
runtime asked is the kernel's own: the functions are looked up through the library's handle
(dlsym searches the library and its dependencies), so it is the libcudart the kernel linked (in
the candidate's process the one torch loaded, when their sonames match: then the same per-thread
state). Where an error stays pending after cudaGetLastError (no driver, as on a CPU-only host,
or a sticky error that ends the process anyway) the watch cannot tell a call's error from the
runtime's and stays off.

The candidate's process reports the first recorded call of a request (`pending_report`, the
reply's PENDING_KEY) and the judge rejects it (`pending_error_failure`, cuda-error). Calls from
the native threads driver (threaded.DRIVER_SOURCE) call the entry point from C and are not
watched; every other call is.
"""
from __future__ import annotations

import ctypes
import threading

PENDING_KEY = "pending_error"

# Errors after which the context is lost: reported by the sync that follows (crash), not here.
_STICKY = frozenset({700, 702, 714, 715, 716, 717, 718, 719})

FIX = ("Clear errors of optional setup with cudaGetLastError, or return them: a runtime call whose failure the "
       "kernel handles (a persisting-L2 set-aside or an access-policy window refused under MPS or a vGPU profile, a "
       "shared-memory opt-in, an allocation with a fallback) records its error as the calling thread's last error "
       "until cudaGetLastError reads it")

REQUEST_WORDS = {"call": "one call", "starved_call": "a call with no GPU memory left to allocate",
                 "capture": "a call captured into a CUDA graph", "endure": "the calls in a row",
                 "timed": "the timed calls", "side_by_side": "calls side by side on two streams",
                 "threads": "calls from host threads at the same time", "then_copy": "one call",
                 "refused_setup": "a call where the persisting-L2 set-aside is refused, as under MPS"}


class ErrorWatch:
    """The calling thread's pending CUDA error around each launch of one library (see above)."""

    def __init__(self, lib):
        """`lib`: the candidate's ctypes library; its own libcudart answers (no runtime: no watch)."""
        self._lock = threading.Lock()
        self.reports: list[dict] = []
        self.off: str | None = None  # why the watch is off: an error no cudaGetLastError clears
        self.cleared_before = 0  # errors found pending before a call (not its doing) and cleared
        try:
            self._peek, self._get = lib.cudaPeekAtLastError, lib.cudaGetLastError
        except AttributeError:
            self._peek = self._get = None
            self.off = "the library reaches no CUDA runtime"
            return
        for fn in (self._peek, self._get):
            fn.restype, fn.argtypes = ctypes.c_int, []
        self._name = getattr(lib, "cudaGetErrorName", None)
        if self._name is not None:
            self._name.restype, self._name.argtypes = ctypes.c_char_p, [ctypes.c_int]

    def error_name(self, code: int) -> str:
        try:
            name = self._name(code) if self._name is not None else None
        except (OSError, ctypes.ArgumentError):
            name = None
        return name.decode() if name else f"cudaError {code}"

    def wrap(self, launch, direction: str):
        """`launch` (returns the entry point's code) with the watch around it."""
        if self._peek is None:
            return launch

        def watched() -> int:
            if self.off is not None:
                return launch()
            if self._peek():  # pending before the call: torch's, or a returned error's; not this call's
                self._get()
                self.cleared_before += 1
                if (stays := self._peek()):
                    self.off = f"{self.error_name(stays)} ({stays}) stays pending after cudaGetLastError"
                    return launch()
            code = launch()
            if code == 0 and (left := self._peek()) and left not in _STICKY:
                self._get()  # cleared: the next call starts clean (no cascade)
                with self._lock:
                    self.reports.append({"code": int(left), "error": self.error_name(left), "direction": direction,
                                         "main_thread": threading.current_thread() is threading.main_thread()})
            return code
        return watched

    def take(self) -> dict | None:
        """The first call recorded since the last take (None: none), and the record emptied."""
        with self._lock:
            first = self.reports[0] if self.reports else None
            self.reports.clear()
        return first


def take_pending(lib) -> dict | None:
    """What `lib` recorded (KernelLibrary.take_pending; a CPU stand-in may define its own), or None."""
    take = getattr(lib, "take_pending", None)
    return take() if callable(take) else None


def pending_report(lib, op: str, reply: dict) -> dict | None:
    """In the candidate's process, after a request: its first call that left an error pending, for
    the reply (always taken, so the next request starts clean). None for a reply that already
    failed (a lost context, an error) and for a capture that failed (not-capturable says more)."""
    report = take_pending(lib)
    if report is None or reply.get("type") in ("fatal", "error"):
        return None
    if op == "capture" and not reply.get("ok", True):
        return None
    return {**report, "op": op}


def local_pending_failure(runner, op: str, direction: str | None, outcome):
    """isolation.LocalRunner's counterpart of the candidate's report and the judge's verdict: the
    Failure for a request `op` whose `outcome` (an Outcome, or a list of sizes) came back with a call
    that left an error pending in `runner.lib` (a compiled library's watch, or a stand-in's own
    `take_pending`), else None."""
    state = {"type": "fatal" if getattr(outcome, "fatal", None) else "done", "ok": getattr(outcome, "ok", True)}
    report = pending_report(runner.lib, op, state)
    return None if report is None else pending_error_failure(runner.spec, {"op": op, "direction": direction}, report)


def pending_error_failure(spec, message: dict, report: dict):
    """The judge's verdict on a reported pending error: cuda-error, naming the error and the fix."""
    from .. import abi
    from .verdict import CUDA_ERROR, Failure

    direction = report.get("direction") or message.get("direction")
    entry = abi.entry_point(spec, direction) if spec is not None and direction else "the kernel"
    code = int(report.get("code", 0))
    name = report.get("error") or f"cudaError {code}"
    op = report.get("op") or message.get("op")
    where = REQUEST_WORDS.get(op, "a call")
    if report.get("main_thread") is False:
        where += ", in a host thread of its own"
    return Failure(CUDA_ERROR, f"{entry} returned success but left {name} pending: the caller's next error check "
                               f"(PyTorch's C10_CUDA_KERNEL_LAUNCH_CHECK) raises it from an unrelated op (seen after "
                               f"{where}: cudaPeekAtLastError in the calling thread returned {name} ({code})). {FIX}")
