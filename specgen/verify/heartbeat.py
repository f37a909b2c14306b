"""The judge's heartbeat to the worker's watch for progress.

The worker's parent stops a verification that sends nothing for IDLE_TIMEOUT_S. Its own steps (the
reference's truth on the CPU, comparisons) are no kernel's time, and on a loaded host they took
past 60 s between two progress lines (session 37: 7 verifications of 15 stopped, a control among
them). So the judge beats every BEAT_S while it works. While a kernel call is in flight in this
process (a stand-in's LocalRunner request) it does not: there the watch is the hang detector. An
IsolatedRunner's request has its own watch (isolation.CALL_TIMEOUT_S), and the beats go on while
it waits.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

BEAT_S = 10.0  # well inside the worker's 60 s watch; a job may ask for more often (every)

_send: Callable[[], None] | None = None
_period = BEAT_S
_in_kernel = 0
_lock = threading.Lock()


@contextmanager
def kernel_running():
    """No beats from the background while a kernel call runs in this process."""
    global _in_kernel
    with _lock:
        _in_kernel += 1
    try:
        yield
    finally:
        with _lock:
            _in_kernel -= 1


def period() -> float:
    return _period


def every(seconds: float) -> None:
    """Beat every `seconds` from now on (the worker's parent says how often it wants to hear)."""
    global _period
    _period = max(float(seconds), 0.05)


def start(send: Callable[[], None]) -> threading.Event:
    """Beats through `send` every `_period` seconds, except while a kernel runs here, until the
    returned event is set."""
    global _send
    _send = send
    stop = threading.Event()

    def loop() -> None:
        last = time.monotonic()
        while not stop.wait(min(_period, 1.0)):
            if time.monotonic() - last >= _period and not _in_kernel:
                send()
                last = time.monotonic()

    threading.Thread(target=loop, name="specgen-heartbeat", daemon=True).start()
    return stop
