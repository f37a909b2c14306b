"""Scale out: the work of `specgen build|generate` over every GPU of a host, or a Dask cluster.

The executor is a small interface (like `concurrent.futures`): `submit(fn, *args, gpu=...)`
gives a `concurrent.futures.Future`; `cancel`, `close`, and events for the progress display.
A task either holds one whole GPU (`gpu=True`: verification, timing, a spec's tuning) or none
(`gpu=False`: compiling, reference checks). Backends:

- `local.LocalExecutor` (`--gpus all|0,1,...`): one worker process per GPU, pinned with
  CUDA_VISIBLE_DEVICES, running one task at a time (so timing never shares its GPU), plus
  CPU worker processes. A worker that dies or hangs is replaced and its task retried once,
  then reported (`WorkerLost`).
- `dask_backend.DaskExecutor` (`--scheduler tcp://HOST:8786`, or `--gpus` with
  `--backend dask`): the same tasks on Dask distributed, a GPU task holding the worker
  resource `GPU: 1`; dask-cuda's LocalCUDACluster when it is installed.

A Ray backend would implement the same four methods. What runs in a task is in tasks.py;
how `specgen build|generate` split their work is in run.py (docs/SCALE.md).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any, Callable

from ..errors import SpecgenError, UsageError


class WorkerLost(SpecgenError):
    """A task's worker died or hung twice (the task was retried once on a fresh worker)."""


Event = dict  # {"type": start|done|retry|failed|log, "label", "slot", "seconds", "text"}


class Executor(ABC):
    """Where tasks run. `slots`: the GPUs it schedules on, as labels (e.g. ["gpu0", "gpu1"])."""

    name = "executor"
    slots: list[str] = []

    def __init__(self) -> None:
        self._listeners: list[Callable[[Event], None]] = []
        self._listen_lock = threading.Lock()

    @abstractmethod
    def submit(self, fn: Callable, *args: Any, gpu: bool = True, label: str = "", **kwargs: Any) -> Future:
        """Run fn(*args, **kwargs) on a worker (one whole GPU when `gpu`); a Future of its result."""

    def cancel(self, future: Future) -> bool:
        """Cancel a task that has not started (a started one runs to its end)."""
        return future.cancel()

    @abstractmethod
    def close(self) -> None:
        """Stop every worker (pending tasks are cancelled)."""

    def on_event(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def _emit(self, **event: Any) -> None:
        event.setdefault("time", time.monotonic())
        with self._listen_lock:
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:  # noqa: BLE001 - a display never stops the work
                    pass

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------- options

def add_scale_arguments(parser) -> None:
    """--gpus / --scheduler / --backend, shared by `specgen build` and `specgen generate`."""
    g = parser.add_argument_group("scale out (docs/SCALE.md)")
    g.add_argument("--gpus", default=None, metavar="all|0,1,...",
                   help="spread the specs over these GPUs of this host, one isolated worker per GPU "
                        "(default: the one-GPU path, in this process)")
    g.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                   help="run the work on this Dask cluster (pip install 'specgen[dask]'); the lock is "
                        "still written here only")
    g.add_argument("--backend", choices=("local", "dask"), default=None,
                   help="with --gpus: local worker processes (default) or a local Dask cluster "
                        "(dask-cuda's LocalCUDACluster when installed)")


def scaled(args) -> bool:
    """Whether the command runs scaled out (--gpus or --scheduler)."""
    on = bool(getattr(args, "gpus", None) or getattr(args, "scheduler", None))
    if getattr(args, "backend", None) and not on:
        raise UsageError(f"--backend {args.backend} needs --gpus (or --scheduler for Dask)")
    return on


def visible_gpu_ids() -> list[str]:
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES when set, else nvidia-smi's list."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [part.strip() for part in env.split(",") if part.strip() and part.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
            return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
        except (OSError, subprocess.SubprocessError):
            pass
    return []


def gpu_label(device: str) -> str:
    """gpu0 for device 0; a UUID or MIG id as it is."""
    return f"gpu{device}" if device.isdigit() else device


def parse_gpus(text: str, visible: list[str] | None = None) -> list[str]:
    """`all` or a comma list of indices into the visible GPUs -> the device ids to pin workers to."""
    visible = visible_gpu_ids() if visible is None else visible
    text = (text or "").strip()
    if text == "all":
        if not visible:
            raise UsageError("--gpus all: no GPU is visible here (nvidia-smi lists none, CUDA_VISIBLE_DEVICES "
                             "is empty); give ids such as --gpus 0,1, or leave --gpus out")
        return list(visible)
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise UsageError(f"--gpus {text!r}: give 'all' or GPU indices such as 0,1")
        if visible and int(part) >= len(visible):
            raise UsageError(f"--gpus {text!r}: GPU {part} is not visible here ({len(visible)} visible)")
        ids.append(visible[int(part)] if visible else part)
    if len(set(ids)) != len(ids):
        raise UsageError(f"--gpus {text!r}: a GPU is named twice")
    return ids


def make_executor(args) -> Executor:
    """The executor the options ask for."""
    scheduler = getattr(args, "scheduler", None)
    backend = getattr(args, "backend", None) or ("dask" if scheduler else "local")
    if scheduler and backend != "dask":
        raise UsageError("--scheduler runs on Dask: leave --backend out or give --backend dask")
    if backend == "dask":
        from .dask_backend import DaskExecutor

        gpus = parse_gpus(args.gpus) if getattr(args, "gpus", None) and not scheduler else None
        return DaskExecutor(address=scheduler, gpus=gpus)
    from .local import LocalExecutor

    return LocalExecutor(parse_gpus(args.gpus), preload=True)
