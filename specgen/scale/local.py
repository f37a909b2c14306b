"""The local backend: one worker process per GPU of this host (and a few for CPU tasks).

Each GPU worker is a spawned Python process with CUDA_VISIBLE_DEVICES set to its one GPU;
it runs one task at a time, so a timing task never shares its GPU with other work. Tasks
are taken in submission order by whichever worker of the right kind is free. A worker that
dies (a segfault, the OOM killer, os._exit) or runs a task past `task_timeout` seconds is
killed and replaced, and the task is retried once on a fresh worker; failing again, its
future gets WorkerLost with both reasons. An exception raised by the task itself is its
result, never retried.
"""
from __future__ import annotations

import collections
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Callable

from . import Executor, WorkerLost, gpu_label

DEFAULT_TASK_TIMEOUT_S = float(os.environ.get("SPECGEN_TASK_TIMEOUT_S", "7200"))
MAX_TRIES = 2  # the first run and one retry


@dataclass
class _Task:
    fn: Callable
    args: tuple
    kwargs: dict
    label: str
    future: Future
    tries: int = 0
    failures: list[str] = field(default_factory=list)


class _Queue:
    """FIFO with put-front (a retried task goes first) and a close."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item, front: bool = False) -> None:
        with self._cond:
            (self._items.appendleft if front else self._items.append)(item)
            self._cond.notify()

    def get(self):
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            return self._items.popleft() if self._items else None

    def close(self) -> list:
        with self._cond:
            self._closed = True
            left, self._items = list(self._items), collections.deque()
            self._cond.notify_all()
            return left


def _worker_main(fd: int) -> None:
    """The worker process (`python -m specgen.scale.local FD`): its environment pins it to
    one GPU (CUDA_VISIBLE_DEVICES, set by the parent); runs tasks from the socket."""
    from multiprocessing.connection import Connection

    from . import context

    conn = Connection(fd)
    if os.environ.get("SPECGEN_WORKER_PRELOAD") == "1":  # start-up work off the first task's time
        try:
            import torch

            import specgen.commands.build  # noqa: F401
            import specgen.commands.generate  # noqa: F401

            if os.environ.get("CUDA_VISIBLE_DEVICES") and torch.cuda.is_available():
                torch.cuda.init()
        except Exception:  # noqa: BLE001 - the task itself will say what is missing
            pass

    context.set_reporter(lambda text: conn.send(("log", str(text))))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        fn, args, kwargs = message
        try:
            result = fn(*args, **kwargs)
            conn.send(("done", True, result))
        except BaseException as error:  # noqa: BLE001 - the task's own failure is its result
            try:
                pickle.dumps(error)
                conn.send(("done", False, error))
            except Exception:  # noqa: BLE001 - an exception that does not pickle travels as text
                conn.send(("done", False, RuntimeError(f"{type(error).__name__}: {error}\n"
                                                       + traceback.format_exc())))


def _has_fileno(stream) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


class _Process:
    """A worker subprocess with the few calls the slot needs (is_alive, join, kill, exitcode)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        try:  # its own session: the verifier's processes it started go with it
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()


class _Slot:
    def __init__(self, executor: "LocalExecutor", label: str, device: str | None, queue: _Queue,
                 preload: bool = False):
        self.executor, self.label, self.device, self.queue = executor, label, device, queue
        self.preload = preload
        self.process = None
        self.conn = None
        if preload:  # started now: its imports overlap the client's own work (the reference checks)
            self._start()
        self.current: _Task | None = None
        self.thread = threading.Thread(target=self._serve, name=f"specgen-{label}", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        parent, child = socket.socketpair()
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="" if self.device is None else self.device,
                   SPECGEN_WORKER_SLOT=self.label, PYTHONUNBUFFERED="1",
                   SPECGEN_WORKER_PRELOAD="1" if self.preload else "0",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # tasks import as here
        self.process = _Process(subprocess.Popen(
            [sys.executable, "-m", "specgen.scale.local", str(child.fileno())], pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None,
            env=env, start_new_session=True))
        child.close()
        self.conn = Connection(parent.detach())

    def stop(self, kill: bool = False) -> None:
        process, conn = self.process, self.conn
        self.process = self.conn = None
        if process is None:
            return
        if not kill and process.is_alive():
            try:
                conn.send(None)
                process.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        if process.is_alive():
            process.kill()
        process.join(timeout=10)
        if conn is not None:
            conn.close()

    def _serve(self) -> None:
        while True:
            task = self.queue.get()
            if task is None:
                self.stop()
                return
            if task.tries == 0 and not task.future.set_running_or_notify_cancel():
                continue  # cancelled before it started
            task.tries += 1
            self.current = task
            try:
                self._run(task)
            except Exception as error:  # noqa: BLE001 - e.g. the worker could not start
                if not task.future.done():
                    task.future.set_exception(error)
            finally:
                self.current = None

    def _run(self, task: _Task) -> None:
        ex = self.executor
        if self.process is None or not self.process.is_alive():
            self.stop(kill=True)
            self._start()
        process, conn = self.process, self.conn
        started = time.monotonic()
        ex._emit(type="start", label=task.label, slot=self.label, attempt=task.tries)
        try:
            conn.send((task.fn, task.args, task.kwargs))
        except (OSError, BrokenPipeError, pickle.PicklingError, AttributeError, TypeError) as error:
            if isinstance(error, (OSError, BrokenPipeError)):
                return self._lost(task, f"the worker on {self.label} could not take the task ({error})")
            task.future.set_exception(error)  # the task itself does not pickle: its own failure
            return
        deadline = started + ex.task_timeout
        while True:
            try:
                ready = conn.poll(0.2)
            except (OSError, EOFError, ValueError):
                ready = False
            if ready:
                try:
                    message = conn.recv()
                except (EOFError, OSError, ValueError):
                    return self._lost(task, self._death(process, started))
                if message[0] == "log":
                    ex._emit(type="log", label=task.label, slot=self.label, text=message[1])
                    continue
                _, ok, value = message
                seconds = time.monotonic() - started
                ex._emit(type="done", label=task.label, slot=self.label, seconds=seconds, ok=ok)
                if ok:
                    task.future.set_result(value)
                else:
                    task.future.set_exception(value)
                return
            if not process.is_alive():
                return self._lost(task, self._death(process, started))
            if time.monotonic() > deadline:
                self.stop(kill=True)
                return self._lost(task, f"the worker on {self.label} ran the task past {ex.task_timeout:g} s "
                                        f"(hung): killed")

    def _death(self, process, started: float) -> str:
        process.join(timeout=5)
        code = process.exitcode
        self.stop(kill=True)
        return (f"the worker on {self.label} died (exit code {code}) after "
                f"{time.monotonic() - started:.1f} s")

    def _lost(self, task: _Task, why: str) -> None:
        task.failures.append(why)
        ex = self.executor
        if task.tries < MAX_TRIES and not ex._closed:
            ex._emit(type="retry", label=task.label, slot=self.label, text=why)
            self.queue.put(task, front=True)
            return
        ex._emit(type="failed", label=task.label, slot=self.label, text=why)
        task.future.set_exception(WorkerLost(f"{task.label or 'a task'}: its worker was lost {task.tries} times; "
                                             + "; then ".join(task.failures)))


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, gpus: list[str], *, cpu_workers: int | None = None,
                 task_timeout: float = DEFAULT_TASK_TIMEOUT_S, preload: bool = False):
        super().__init__()
        self.gpus = list(gpus)
        self.task_timeout = task_timeout
        self.slots = [gpu_label(g) for g in self.gpus]
        self._closed = False
        self._gpu_queue, self._cpu_queue = _Queue(), _Queue()
        cpu_count = cpu_workers if cpu_workers is not None else max(1, min(4, (os.cpu_count() or 2) // 2))
        self._workers = [_Slot(self, gpu_label(g), g, self._gpu_queue, preload) for g in self.gpus]
        self._workers += [_Slot(self, f"cpu{i}", None, self._cpu_queue) for i in range(cpu_count)]
        self._has_cpu_workers = cpu_count > 0

    def submit(self, fn: Callable, *args: Any, gpu: bool = True, label: str = "", **kwargs: Any) -> Future:
        if self._closed:
            raise RuntimeError("the executor is closed")
        if gpu and not self.gpus:
            raise RuntimeError("a GPU task, but this executor has no GPU")
        future: Future = Future()
        on_gpu = gpu or not self._has_cpu_workers  # no CPU worker: a GPU worker takes it
        (self._gpu_queue if on_gpu else self._cpu_queue).put(_Task(fn, args, kwargs, label or fn.__name__, future))
        return future

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for queue in (self._gpu_queue, self._cpu_queue):
            for task in queue.close():
                task.future.cancel()
        for slot in self._workers:
            if slot.current is not None:
                slot.stop(kill=True)
        for slot in self._workers:
            slot.thread.join(timeout=15)


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]))
