"""The worker process that runs candidates on the GPU, with a timeout.

A crash (segfault, illegal address) kills only the worker: it becomes a `crash` verdict and
the next candidate gets a fresh worker. A worker that is still healthy is kept warm (torch
imported, CUDA initialised, the references loaded) and reused across candidates.

Protocol: jobs go in as JSON lines on the worker's stdin; messages come back as JSON lines
on a dedicated pipe (the kernel's own printf and any library noise go to a log file, so
they cannot corrupt the protocol).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from ..errors import EnvironmentMissing, SpecError, UsageError
from . import heartbeat
from .verdict import CRASH, TIMEOUT, Verdict

STARTUP_TIMEOUT_S = 240.0
# no message for this long: the judge beats while it works (heartbeat.py) and a request to the
# kernel's process has its own load-aware watch, so silence is a kernel hanging in this process
# (a stand-in's) or a worker that stopped
IDLE_TIMEOUT_S = 60.0
# the whole verification, less its waits for the GPU lock: it only bounds a kernel slow at every
# call (the idle watch and the per-call timeout catch hangs). Honest kernels took up to 460 s
# beside eight other verifications on the H200 (sessions 30-32), too close to the 600 s it was
TOTAL_TIMEOUT_S = 1200.0
_ERRORS = {"SpecError": SpecError, "EnvironmentMissing": EnvironmentMissing, "UsageError": UsageError}


def judge_environment() -> dict[str, str]:
    """The judge's environment: ours, with our import path (the judge runs the spec's reference,
    which may be imported by path from a module only the caller's sys.path reaches)."""
    from ..sandbox import callers_import_path

    env = dict(os.environ)
    env["PYTHONPATH"] = callers_import_path(after=env.get("PYTHONPATH", ""))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # OpenMP threads that sleep when idle instead of spinning: verifications run side by side (the
    # GPU suite runs 5-15 at once), and the judge's CPU work is small tensors (the reference's
    # class screen, CPU references), where spinning threads of many processes starve each other.
    # Measured on 2 cores, 6 processes screening four example specs at once: 40 s each spinning,
    # 5 s each passive (1.2 s alone either way). The user's own setting wins.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


class WorkerDied(Exception):
    pass


class VerifyWorker:
    def __init__(self, *, startup_timeout: float = STARTUP_TIMEOUT_S):
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self._read_fd: int | None = None
        self._buffer = b""
        self._log_path: Path | None = None
        self.device: str | None = None

    # -------------------------------------------------------------- lifecycle

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.alive():
            return
        self.close()
        read_fd, write_fd = os.pipe()
        log = tempfile.NamedTemporaryFile(prefix="specgen-worker-", suffix=".log", delete=False)
        self._log_path = Path(log.name)
        env = judge_environment()
        self.process = subprocess.Popen([sys.executable, "-m", "specgen.verify.worker", str(write_fd)],
                                        stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                        pass_fds=(write_fd,), env=env, start_new_session=True)
        log.close()
        os.close(write_fd)
        self._read_fd, self._buffer = read_fd, b""
        message = self._next_message(self.startup_timeout)
        if message is None:
            tail = self.log_tail()
            self.close()
            raise EnvironmentMissing(f"the verifier's worker did not start within {self.startup_timeout:.0f} s"
                                     f"{': ' + tail if tail else ''}")
        if message["type"] == "error":
            self.close()
            raise _ERRORS.get(message.get("kind"), RuntimeError)(message["message"])
        self.device = message.get("device")

    def close(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                try:
                    self.process.stdin.close()
                    self.process.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    self.kill()
            self.process = None
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self._log_path.read_text(errors="replace") if self._log_path else ""
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    # -------------------------------------------------------------- messages

    def _next_message(self, timeout: float) -> dict | None:
        """The next message, None on timeout; WorkerDied when the pipe closes."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._read_fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                raise WorkerDied()
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    # -------------------------------------------------------------- one candidate

    def verify(self, spec_path: str | Path, library: str | Path, options: dict, *,
               idle_timeout: float = IDLE_TIMEOUT_S, total_timeout: float = TOTAL_TIMEOUT_S,
               on_progress=None) -> Verdict:
        self.start()
        job = {"spec": str(Path(spec_path).resolve()), "library": str(library), "options": options,
               "beat_s": min(heartbeat.BEAT_S, idle_timeout / 4)}
        self.process.stdin.write((json.dumps(job) + "\n").encode())
        self.process.stdin.flush()
        last = "starting"
        deadline = time.monotonic() + total_timeout
        waited = 0.0  # seconds the worker reported waiting for the GPU lock: not the kernel's time
        while True:
            wait = min(idle_timeout, deadline - time.monotonic())
            try:
                message = self._next_message(max(wait, 0.0))
            except WorkerDied:
                return self._died(last)
            if message is None:
                self.kill()
                self.close()
                if time.monotonic() >= deadline:
                    return Verdict(TIMEOUT, f"the verification ran for more than {total_timeout:.0f} s in total "
                                            f"(waits for the GPU not counted) and was stopped while running: {last}. "
                                            f"Every call of the kernel is probably very slow (a loop far longer "
                                            f"than the data, a spin wait that ends late)", fatal=True)
                return Verdict(TIMEOUT, f"the kernel ran for more than {idle_timeout:.0f} s without progress while "
                                        f"running: {last}. It probably never finishes (an infinite loop, "
                                        f"__syncthreads in divergent code, a spin wait on a flag)", fatal=True)
            kind = message["type"]
            if kind == "waiting":  # a heartbeat while another verification has the GPU
                deadline += max(0.0, float(message["seconds"]) - waited)
                waited = max(waited, float(message["seconds"]))
            elif kind == "alive":  # the judge at work (heartbeat.py): the watch starts again
                continue
            elif kind == "progress":
                waited = 0.0  # a wait's heartbeats count from its start; any progress begins another
                last = message["text"]
                if on_progress:
                    on_progress(last)
            elif kind == "verdict":
                verdict = Verdict.from_json(message["verdict"])
                if verdict.fatal:  # the worker exits after a lost context: reap it
                    self.close()
                return verdict
            elif kind == "error":
                raise _ERRORS.get(message.get("kind"), RuntimeError)(message["message"])

    def _died(self, last: str) -> Verdict:
        code = self.process.wait() if self.process else None
        tail = self.log_tail()
        self.close()
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        detail = f"the worker process died ({how}) while running: {last}"
        if tail:
            detail += f"\nits last output:\n{tail}"
        return Verdict(CRASH, detail, fatal=True)


_shared: VerifyWorker | None = None


def shared_worker() -> VerifyWorker:
    """The process-wide warm worker (started on first use, closed at exit)."""
    global _shared
    if _shared is None:
        _shared = VerifyWorker()
        atexit.register(_shared.close)
    return _shared


# ------------------------------------------------------------------ the worker side

def _serve(fd: int) -> int:
    channel = os.fdopen(fd, "w", buffering=1)
    sending = threading.Lock()  # the heartbeat's thread writes too: whole lines, one at a time

    def send(**message) -> None:
        with sending:
            channel.write(json.dumps(message) + "\n")
            channel.flush()

    device = os.environ.get("SPECGEN_WORKER_DEVICE", "cuda")  # "cpu": the unit tests' stand-in kernels
    try:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            send(type="error", kind="EnvironmentMissing",
                 message="no CUDA GPU is visible to torch in the verifier's worker (torch "
                         f"{torch.__version__}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
            return 3
        torch.empty(1, device=device)
        from ..spec import load_spec
        from . import isolation
        from .engine import Options, run_verification

        isolation.keep_spare = device == "cuda"  # candidates one after another: start each process ahead
        atexit.register(isolation.drop_spare)
    except Exception:
        send(type="error", kind="internal", message="the verifier's worker failed to start:\n" + traceback.format_exc())
        return 1
    send(type="ready", device=torch.cuda.get_device_name() if device == "cuda" else device)
    heartbeat.start(lambda: send(type="alive"))
    specs: dict[tuple[str, float], object] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        heartbeat.every(job.get("beat_s", heartbeat.BEAT_S))
        try:
            key = (job["spec"], os.path.getmtime(job["spec"]))
            if key not in specs:
                specs[key] = load_spec(job["spec"])
            library = _resolve_library(specs[key], job["library"])
            verdict = _profiled(run_verification, specs[key], library, Options(**job["options"]),
                                progress=lambda text: send(type="progress", text=text), device=device,
                                waiting=lambda seconds: send(type="waiting", seconds=round(seconds, 1)))
            send(type="verdict", verdict=verdict.to_json())
            if verdict.fatal:
                return 0  # the CUDA context is unusable: the next candidate gets a fresh worker
        except Exception as error:
            kind = type(error).__name__
            message = str(error) if kind in _ERRORS else "verifier internal error:\n" + traceback.format_exc()
            send(type="error", kind=kind if kind in _ERRORS else "internal", message=message)
        finally:
            _give_back_memory(device)
    return 0


def _give_back_memory(device: str) -> None:
    """Between jobs the worker holds no tensors: its allocator's cache goes back to the GPU, where
    other verifications plan their full-size cases to the memory free (memory.py)."""
    if device == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


def _profiled(function, *args, **kwargs):
    """function(*args, **kwargs); with SPECGEN_WORKER_PROFILE=FOLDER set, under cProfile, its
    statistics written there (one .prof and one text summary per job): where verification spends
    its time, measured on the GPU rather than guessed."""
    folder = os.environ.get("SPECGEN_WORKER_PROFILE")
    if not folder:
        return function(*args, **kwargs)
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    try:
        return profile.runcall(function, *args, **kwargs)
    finally:
        os.makedirs(folder, exist_ok=True)
        stem = os.path.join(folder, f"verify-{os.getpid()}-{time.strftime('%H%M%S')}-{time.perf_counter_ns() % 10**6}")
        profile.dump_stats(stem + ".prof")
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(60)
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)
        with open(stem + ".txt", "w") as summary:
            summary.write(text.getvalue())


def _resolve_library(spec, library: str):
    """A .so path, or `py:module:factory` (tests: a Python stand-in built by factory(spec))."""
    if library.startswith("py:"):
        import importlib

        module, _, factory = library[3:].partition(":")
        return getattr(importlib.import_module(module), factory)(spec)
    return library


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1])))
