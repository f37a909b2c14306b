"""What a running task knows about where it runs: its slot (GPU) and a way to report progress.

A backend's worker sets the reporter; a task calls `report(text)` (a no-op elsewhere, e.g. in
the one-GPU path), and the client's progress display shows the line with the task's label.
"""
from __future__ import annotations

import os
from typing import Callable

_reporter: Callable[[str], None] | None = None


def set_reporter(reporter: Callable[[str], None] | None) -> None:
    global _reporter
    _reporter = reporter


def report(text: str) -> None:
    if _reporter is not None:
        try:
            _reporter(text)
        except Exception:  # noqa: BLE001 - progress never fails a task
            pass


def slot() -> str:
    """This worker's slot label (gpu0, cpu1, a Dask worker's name), "" outside a worker."""
    if os.environ.get("SPECGEN_WORKER_SLOT"):
        return os.environ["SPECGEN_WORKER_SLOT"]
    try:  # a Dask worker: its name
        from distributed import get_worker

        return str(get_worker().name)
    except Exception:  # noqa: BLE001 - not in a worker, or no Dask here
        return ""
