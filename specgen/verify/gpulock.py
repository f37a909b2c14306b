"""Who may use a GPU at once. Timing and full-size cases need it alone: timing beside other
work measures the other work, and a 10 GB case with its float64 truth takes tens of GB. Small
cases may share it. So: a readers-writer lock per GPU.

- `exclusive_gpu`: timed calls, full-size cases, `specgen bench` (and the tuner's timings).
- `shared_gpu`: the small cases of a verification; many holders at once, none while an
  exclusive holder runs.

Two advisory locks (flock) on files named after the GPU's UUID in the temp folder: `.lock` is
taken shared or exclusive; `.turn` is a turnstile that an exclusive holder keeps while it waits,
so a stream of shared holders cannot starve it. The kernel releases both when the holder
exits, however it exits.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from typing import Callable, Iterator

LOCK_ENV = "SPECGEN_GPU_LOCK_DIR"  # where the lock files live (default: the temp folder)
POLL_S = 0.05
HEARTBEAT_S = 10.0


def _gpu_key(device_index: int) -> str:
    import torch

    try:
        return str(torch.cuda.get_device_properties(device_index).uuid)
    except Exception:  # noqa: BLE001 - older torch: the index among the visible devices
        return f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}-{device_index}"


def lock_path(device_index: int) -> str:
    folder = os.environ.get(LOCK_ENV) or tempfile.gettempdir()
    return os.path.join(folder, f"specgen-gpu-{_gpu_key(device_index)}.lock")


class _Waiter:
    """Polls a non-blocking flock, telling `progress` once and `waiting` every HEARTBEAT_S."""

    def __init__(self, progress, waiting, what: str):
        self.progress, self.waiting, self.what = progress, waiting, what
        self.started = self.beat = time.perf_counter()
        self.told = False

    def take(self, fd: int, mode: int) -> None:
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if self.progress and not self.told:
                    self.progress(f"waiting for the GPU: {self.what}")
                    self.told = True
                now = time.perf_counter()
                if self.waiting and now - self.beat >= HEARTBEAT_S:
                    self.waiting(now - self.started)
                    self.beat = now
                time.sleep(POLL_S)

    def done(self) -> float:
        waited = time.perf_counter() - self.started
        if self.waiting and self.told:
            self.waiting(waited)
        return waited


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)


@contextlib.contextmanager
def exclusive_gpu(device_index: int = 0, progress: Callable[[str], None] | None = None,
                  path: str | None = None, waiting: Callable[[float], None] | None = None) -> Iterator[float]:
    """Hold the GPU alone for the block; yields the seconds spent waiting. While it waits,
    `waiting(seconds so far)` is called every HEARTBEAT_S: a watchdog that times the kernel
    (the verifier's worker) must not count the wait against it."""
    path = path or lock_path(device_index)
    lock, turn = _open(path), _open(path + ".turn")
    try:
        waiter = _Waiter(progress, waiting, "another verification or benchmark is using it")
        waiter.take(turn, fcntl.LOCK_EX)  # new shared holders queue behind us from here
        waiter.take(lock, fcntl.LOCK_EX)
        os.close(turn)
        turn = -1
        yield waiter.done()
    finally:
        for fd in (lock, turn):
            if fd >= 0:
                os.close(fd)  # closing the descriptor releases its lock


@contextlib.contextmanager
def shared_gpu(device_index: int = 0, progress: Callable[[str], None] | None = None,
               path: str | None = None, waiting: Callable[[float], None] | None = None) -> Iterator[float]:
    """Share the GPU for the block with other shared holders, never with an exclusive one."""
    path = path or lock_path(device_index)
    lock, turn = _open(path), _open(path + ".turn")
    try:
        waiter = _Waiter(progress, waiting, "another verification or benchmark is timing on it")
        waiter.take(turn, fcntl.LOCK_EX)  # pass the turnstile: an exclusive holder waiting keeps it
        fcntl.flock(turn, fcntl.LOCK_UN)
        waiter.take(lock, fcntl.LOCK_SH)
        yield waiter.done()
    finally:
        os.close(turn)
        os.close(lock)
