"""SIGTERM and SIGHUP end a specgen command the way Ctrl-C does: as an exception.

Python's default for SIGTERM is to die on the spot, leaving `specgen-build-*` and
`specgen-abi-*` folders behind and children running. Turned into an exception (a
KeyboardInterrupt subclass, so every `with` block and every guard that stops children on
Ctrl-C does the same here), the command unwinds: temporary folders are removed, children
stopped (specgen.procguard), the lock left as it was (its writes are atomic).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM, SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum, _frame):
    raise Terminated(signum)


@contextlib.contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise Terminated (main thread only; restored after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[signum] = signal.signal(signum, _raise)
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
