"""Run user code (a spec's reference) where it can do the least harm: the parent side.

A sandbox is one long-lived child process, started with an environment scrubbed of API
keys, tokens and secrets and a scratch working directory; it imports torch once and then
forks one short-lived grandchild per call (`specgen check` makes one call per spec file).
Each grandchild runs in its own process group and scratch folder, under a memory limit
(RLIMIT_AS), a CPU limit (RLIMIT_CPU), a file-size limit and a wall-clock timeout, with
stdin closed and its output captured; whatever it leaves running is killed when it returns.
Every process of the sandbox dies with specgen (specgen.procguard's death signal).

Requests go down as pickles (specgen's own data, trusted); replies come back as JSON only,
so nothing the user's code writes is ever unpickled here. This is damage control for
careless code, not a security boundary: see docs/SECURITY.md.
"""
from __future__ import annotations

import atexit
import json
import os
import pickle
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import EnvironmentMissing

SECRET_NAME = re.compile(r"(_API_KEY$|_TOKEN$|SECRET|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY)",
                         re.IGNORECASE)
STARTUP_TIMEOUT_S = 300.0  # importing torch on a loaded machine
REPLY_SLACK_S = 30.0  # the sandbox enforces the call's timeout; the parent waits this much longer
MAX_REPLY_BYTES = 4 << 20
_FRAME = struct.Struct(">I")


def callers_import_path(before: str = "", after: str = "") -> str:
    """PYTHONPATH for a child process that must import what this process can: `before`, this
    process's sys.path (its working directory for ''), then `after`; so a reference imported by
    path (`reference: pkg.module:name`) resolves in the child as it does for the caller."""
    caller = [os.path.abspath(p or os.getcwd()) for p in sys.path if os.path.isdir(p or os.getcwd())]
    return os.pathsep.join(dict.fromkeys(p for p in (before, *caller, after) if p))


def scrubbed_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without API keys, tokens, secrets, passwords and credentials."""
    return {k: v for k, v in (os.environ if env is None else env).items() if not SECRET_NAME.search(k)}


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 60.0  # wall clock, per call
    cpu_s: int = 120  # CPU seconds, per call
    memory_mb: int = 4096  # address space on top of what the sandbox holds after importing torch
    file_mb: int = 64  # largest file the call may write (its captured output included)
    tasks: int = 256  # processes and threads on top of the user's own (RLIMIT_NPROC; not for root)


def write_frame(stream, payload: bytes) -> None:
    stream.write(_FRAME.pack(len(payload)) + payload)
    stream.flush()


def read_frame_fd(fd: int, deadline: float, limit: int = MAX_REPLY_BYTES) -> bytes | None:
    """One length-prefixed frame from `fd`, or None on EOF, timeout or an oversized frame."""
    header = _read_exact(fd, _FRAME.size, deadline)
    if header is None:
        return None
    (size,) = _FRAME.unpack(header)
    if size > limit:
        return None
    return _read_exact(fd, size, deadline)


def _read_exact(fd: int, size: int, deadline: float) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(fd, min(size - got, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class Sandbox:
    """One sandbox process; `call` runs `module:function(*args)` in a fresh, limited grandchild."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._scratch: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        from .procguard import set_parent_death_signal  # noqa: F401 - the child imports it too

        _sweep_stale_scratch()
        self._scratch = tempfile.mkdtemp(prefix=f"specgen-sandbox-{os.getpid()}-")
        env = scrubbed_env()
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = callers_import_path(before=package_root, after=env.get("PYTHONPATH", ""))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        for name in ("TMPDIR", "TEMP", "TMP"):
            env[name] = self._scratch
        log = open(os.path.join(self._scratch, ".sandbox.log"), "wb")
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "specgen.sandbox_child", str(os.getpid()), self._scratch],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=self._scratch, env=env,
                start_new_session=True)
        finally:
            log.close()
        ready = read_frame_fd(self._process.stdout.fileno(), time.monotonic() + STARTUP_TIMEOUT_S)
        if ready is None:
            tail = self._log_tail()
            self.close()
            raise EnvironmentMissing(f"the sandbox that runs spec references did not start "
                                     f"({sys.executable} -m specgen.sandbox_child):\n{tail}")

    def _log_tail(self, limit: int = 3000) -> str:
        try:
            return Path(self._scratch, ".sandbox.log").read_text(errors="replace")[-limit:]
        except (OSError, TypeError):
            return ""

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                process.stdin.close()
                process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                _kill_group(process.pid)
                process.wait()
            for stream in (process.stdout,):
                stream.close()
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # ------------------------------------------------------------------ calls
    def call(self, target: str, *args, limits: Limits = Limits()) -> dict:
        """Run `target` ("module:function") on `args` in a grandchild; the JSON reply as a dict:

        {"status": "ok", "value": ...} | {"status": "error", "error": {...}} (a SpecgenError)
        | {"status": "crash", "type", "message"} (another exception) | {"status": "timeout"}
        | {"status": "died", "exit_code", "signal", "output"} | {"status": "lost", "output"}.
        """
        with self._lock:
            if not self.alive:
                self.close()
                self._start()
            # the caller's import path as it is now (tests and tools extend it after start)
            path = [os.path.abspath(p or os.getcwd()) for p in sys.path if os.path.isdir(p or os.getcwd())]
            request = pickle.dumps({"target": target, "args": args, "limits": limits, "path": path})
            try:
                write_frame(self._process.stdin, request)
            except (BrokenPipeError, OSError):
                return self._lost("the sandbox process is gone")
            deadline = time.monotonic() + limits.timeout_s + REPLY_SLACK_S
            frame = read_frame_fd(self._process.stdout.fileno(), deadline)
            if frame is None:
                return self._lost("the sandbox process did not answer")
            try:
                reply = json.loads(frame.decode("utf-8", errors="replace"))
            except ValueError:
                return self._lost("the sandbox process answered nonsense")
            return reply if isinstance(reply, dict) and "status" in reply else self._lost("malformed reply")

    def _lost(self, why: str) -> dict:
        tail = self._log_tail()
        if self._process is not None:
            _kill_group(self._process.pid)
        self.close()
        return {"status": "lost", "output": f"{why}\n{tail}".strip()}


def _sweep_stale_scratch() -> None:
    """Remove the scratch folders of sandboxes whose specgen is gone (all killed at once, e.g.
    by SIGKILL to a whole process tree, nothing could remove them): `specgen-sandbox-<pid>-*`."""
    for folder in Path(tempfile.gettempdir()).glob("specgen-sandbox-*-*"):
        match = re.fullmatch(r"specgen-sandbox-(\d+)-\w+", folder.name)
        if not match or int(match.group(1)) == os.getpid():
            continue
        try:
            if folder.stat().st_uid != os.getuid():
                continue
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError):
            continue


def _kill_group(pid: int) -> None:
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_shared: Sandbox | None = None


def shared_sandbox() -> Sandbox:
    """The process-wide sandbox (started on first use, closed at exit)."""
    global _shared
    if _shared is None:
        _shared = Sandbox()
        atexit.register(_shared.close)
    return _shared
