"""The Dask distributed backend (`pip install 'specgen[dask]'`).

- `--scheduler tcp://HOST:8786`: join any Dask cluster (SLURM, Kubernetes, a set of GPU
  hosts). Its GPU workers must advertise the resource `GPU=1` (e.g. `dask worker
  tcp://HOST:8786 --nthreads 1 --resources GPU=1`, one per GPU, CUDA_VISIBLE_DEVICES set;
  `dask cuda worker ... --resources GPU=1` does both).
- `--gpus ... --backend dask`: a local cluster, one worker per GPU: dask-cuda's
  LocalCUDACluster when it is installed, else one Nanny per GPU with CUDA_VISIBLE_DEVICES.

A GPU task asks for `resources={"GPU": 1}`, so the scheduler runs one at a time per GPU
worker (timing never shares its GPU). A worker that dies mid-task: the scheduler gives the
task to another worker; past `distributed.scheduler.allowed-failures` deaths (set to 1 on
the clusters made here: one retry) the future fails with KilledWorker, reported here as
WorkerLost. A hung candidate is the verifier's own business (its candidate process has
idle and total timeouts), so a Dask worker itself does not hang on a kernel.
"""
from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import Future
from typing import Any, Callable

from ..errors import EnvironmentMissing
from . import Executor, WorkerLost, gpu_label

TOPIC = "specgen-progress"
ALLOWED_FAILURES = 1  # a task whose worker dies is retried once, then reported


def _import_distributed():
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise EnvironmentMissing("the Dask backend needs dask distributed: pip install 'specgen[dask]'") from None
    return distributed


def _run_task(fn: Callable, label: str, args: tuple, kwargs: dict):
    """On the Dask worker: the task with its progress lines sent to the client as events."""
    from distributed import get_worker

    from . import context

    worker = get_worker()
    slot = str(worker.name)

    def send(kind: str, **data) -> None:
        try:
            worker.log_event(TOPIC, {"type": kind, "label": label, "slot": slot, **data})
        except Exception:  # noqa: BLE001 - progress never fails a task
            pass

    context.set_reporter(lambda text: send("log", text=str(text)))
    started = time.monotonic()
    send("start")
    try:
        result = fn(*args, **kwargs)
    except BaseException:
        send("done", seconds=time.monotonic() - started, ok=False)
        raise
    finally:
        context.set_reporter(None)
    send("done", seconds=time.monotonic() - started, ok=True)
    return result


def tolerate_repeated_removes(cluster):
    """Keep a cluster's worker watch alive when the scheduler reports a worker gone twice.

    A worker that dies mid-task can be removed twice (its stream closes, then its nanny reports);
    distributed's SpecCluster looks the second removal up and raises KeyError, which ends the
    watch task and surfaces at `cluster.close()`, leaving the close half done (dask/distributed
    issue 5407). A removal of an address the cluster no longer knows is a no-op here."""
    update = cluster._update_worker_status

    def update_ignoring_unknown_removal(op, msg):
        if op == "remove" and msg not in cluster.scheduler_info.get("workers", {}):
            return
        update(op, msg)

    cluster._update_worker_status = update_ignoring_unknown_removal
    return cluster


def _local_cluster(gpus: list[str]):
    """One worker per GPU on this host, each pinned to its GPU and holding the resource GPU=1."""
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            LocalCUDACluster = None
        if LocalCUDACluster is not None:
            return tolerate_repeated_removes(
                LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(gpus), threads_per_worker=1,
                                 resources={"GPU": 1}, dashboard_address=None,
                                 silence_logs=logging.ERROR))
        from distributed import Nanny, Scheduler, SpecCluster

        workers = {gpu_label(g): {"cls": Nanny, "options": {"nthreads": 1, "resources": {"GPU": 1}, "silence_logs": logging.ERROR,
                                                          "env": {"CUDA_VISIBLE_DEVICES": g,
                                                                  "SPECGEN_WORKER_SLOT": gpu_label(g)}}}
                   for g in gpus}
        scheduler = {"cls": Scheduler, "options": {"dashboard": False, "dashboard_address": ":0"}}
        return tolerate_repeated_removes(SpecCluster(workers=workers, scheduler=scheduler,
                                                     asynchronous=False, silence_logs=logging.ERROR))


class DaskExecutor(Executor):
    name = "dask"

    def __init__(self, address: str | None = None, gpus: list[str] | None = None, *, client=None):
        super().__init__()
        distributed = _import_distributed()
        self._cluster = None
        if client is not None:
            self.client, self._own_client = client, False
        else:
            if address is None:
                if not gpus:
                    raise EnvironmentMissing("the Dask backend needs --scheduler tcp://HOST:8786 or --gpus")
                self._cluster = _local_cluster(gpus)
                address = self._cluster
            self.client, self._own_client = distributed.Client(address), True
        self._futures: dict[int, Any] = {}
        workers = self.client.scheduler_info().get("workers", {})
        self.slots = sorted(str(w.get("name")) for w in workers.values()
                            if (w.get("resources") or {}).get("GPU"))
        try:
            self.client.subscribe_topic(TOPIC, self._on_topic)
        except Exception:  # noqa: BLE001 - an old distributed: no live progress, results still come
            pass

    def _on_topic(self, event) -> None:
        data = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if isinstance(data, dict):
            self._emit(**data)

    def submit(self, fn: Callable, *args: Any, gpu: bool = True, label: str = "", **kwargs: Any) -> Future:
        label = label or getattr(fn, "__name__", "task")
        key = f"specgen-{label}-{uuid.uuid4().hex[:8]}".replace(" ", "_")
        dask_future = self.client.submit(_run_task, fn, label, args, kwargs, key=key, pure=False,
                                         resources={"GPU": 1} if gpu else None)
        future: Future = Future()
        self._futures[id(future)] = dask_future
        dask_future.add_done_callback(lambda f: self._transfer(f, future, label))
        return future

    def _transfer(self, dask_future, future: Future, label: str) -> None:
        from distributed.scheduler import KilledWorker

        self._futures.pop(id(future), None)
        if future.done():
            return
        status = dask_future.status
        if status == "cancelled":
            future.cancel()
            return
        if not future.set_running_or_notify_cancel():
            return
        if status == "finished":
            future.set_result(dask_future.result())
            return
        error = dask_future.exception()
        if isinstance(error, KilledWorker):
            self._emit(type="failed", label=label, slot="dask", text=str(error))
            error = WorkerLost(f"{label}: its Dask worker died while running it, again after the retry "
                               f"({error})")
        future.set_exception(error)

    def cancel(self, future: Future) -> bool:
        dask_future = self._futures.get(id(future))
        if dask_future is not None:
            dask_future.cancel()
        return future.cancel()

    def close(self) -> None:
        for dask_future in list(self._futures.values()):
            dask_future.cancel()
        self._futures.clear()
        if self._own_client:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
