"""Task functions for the scale-out tests (tests only): real functions with deterministic
results, run in real worker processes (the local backend's, a local Dask cluster's)."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path


def whoami(x=None):
    """Where the task ran: the GPU the worker is pinned to, its slot, its pid."""
    from specgen.scale import context

    context.report(f"running {x}")
    return {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "slot": context.slot(), "pid": os.getpid(), "x": x}


def square(x):
    return x * x


def fail(message):
    raise ValueError(message)


def die_once(marker: str, value):
    """Kill the worker the first time (the marker file says whether it already happened)."""
    path = Path(marker)
    if not path.exists():
        path.write_text("died")
        os._exit(9)
    return value


def always_die():
    os._exit(7)


def hang_once(marker: str, value):
    path = Path(marker)
    if not path.exists():
        path.write_text("hung")
        time.sleep(3600)
    return value


def sleep_then(seconds: float, value):
    time.sleep(seconds)
    return value


def fake_verify(spec_text: str, source: str) -> dict:
    """A verifier stand-in: a verdict that depends only on the spec and the kernel text."""
    digest = hashlib.sha256((spec_text + "\0" + source).encode()).hexdigest()
    passed = "BUG" not in source
    return {"passed": passed, "kernel_hash": hashlib.sha256(source.encode()).hexdigest(),
            "reason": "" if passed else "output mismatch at [0]", "fingerprint": digest[:16],
            "kernel_us": 10.0 + int(digest[:4], 16) % 100}


def ledger_add(ledger, cost: float) -> float:
    return ledger.add(cost)


def spec_task_dying_on(op: str):
    """A spec task (payload, options, ledger) whose worker dies on the spec `op`, every time."""
    return _SpecTask(op)


class _SpecTask:
    def __init__(self, op: str):
        self.op = op
        self.__name__ = "spec_task"

    def __call__(self, payload, options, ledger):
        if payload["op"] == self.op:
            os._exit(3)
        return {"op": payload["op"], "slot": os.environ.get("SPECGEN_WORKER_SLOT"), "seconds": 0.1,
                "action": "reused"}
