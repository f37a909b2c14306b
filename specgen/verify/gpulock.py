"""One process at a time on a GPU for the work that needs it alone: timed calls and full-size
cases. Timing beside other work measures the other work; full-size cases hold tens of GB (the
float64 truth of a 10 GB case), so two at once can run the GPU out of memory. Verifications
running side by side share the GPU for their small cases and take turns here.

An advisory lock (flock) on a file named after the GPU's UUID, in the temp folder: released
by the kernel when the holder exits, however it exits.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from typing import Callable, Iterator

LOCK_ENV = "SPECGEN_GPU_LOCK_DIR"  # where the lock files live (default: the temp folder)


def _gpu_key(device_index: int) -> str:
    import torch

    try:
        return str(torch.cuda.get_device_properties(device_index).uuid)
    except Exception:  # noqa: BLE001 - older torch: the index among the visible devices
        return f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}-{device_index}"


def lock_path(device_index: int) -> str:
    folder = os.environ.get(LOCK_ENV) or tempfile.gettempdir()
    return os.path.join(folder, f"specgen-gpu-{_gpu_key(device_index)}.lock")


@contextlib.contextmanager
def exclusive_gpu(device_index: int = 0, progress: Callable[[str], None] | None = None,
                  path: str | None = None) -> Iterator[float]:
    """Hold the GPU's lock for the block; yields the seconds spent waiting for it."""
    path = path or lock_path(device_index)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        started = time.perf_counter()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                progress("waiting for the GPU: another verification or benchmark is timing on it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield time.perf_counter() - started
    finally:
        os.close(fd)  # closing the descriptor releases the lock
