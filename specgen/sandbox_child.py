"""The sandbox process (see specgen/sandbox.py): `python -m specgen.sandbox_child PARENT_PID SCRATCH`.

Imports torch once, then for each request read from stdin forks a grandchild that runs the
request's target under limits in a scratch folder, and answers with one JSON frame on
stdout. The grandchild's stdout and stderr go to a file; its result comes back through a
pipe of its own; it is killed (with its whole process group) at the timeout and after it
answers.
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import resource
import select
import shutil
import signal
import sys
import tempfile
import time

from specgen.procguard import set_parent_death_signal
from specgen.sandbox import MAX_REPLY_BYTES, write_frame

_exit = os._exit  # held here: user code may replace os._exit, json.dumps, ... in the grandchild
_dumps = json.dumps
_write = os.write


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _user_tasks() -> int | None:
    """Processes and threads of this user (what RLIMIT_NPROC counts), or None where unknown."""
    uid, count = os.getuid(), 0
    try:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        count += len(os.listdir(f"/proc/{entry.name}/task"))
                except OSError:
                    continue
    except OSError:
        return None
    return count


def _set_limit(which: int, soft: int, hard: int | None = None) -> None:
    hard = soft if hard is None else hard
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    try:
        resource.setrlimit(which, (soft, hard))
    except (ValueError, OSError):
        pass


def _grandchild(request: dict, result_fd: int, task_dir: str) -> None:
    """Runs in the forked grandchild; never returns."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    set_parent_death_signal(signal.SIGKILL)
    output = os.open(os.path.join(task_dir, ".output"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.closerange(3, result_fd)  # the sandbox's own pipes among them: only the result pipe stays open
    os.closerange(result_fd + 1, 1 << 16)
    os.chdir(task_dir)
    for name in ("TMPDIR", "TEMP", "TMP", "HOME"):
        os.environ[name] = task_dir
    for entry in reversed(request.get("path", [])):  # the caller's import path, first
        if entry not in sys.path:
            sys.path.insert(0, entry)
    limits = request["limits"]
    if vm := _vm_bytes():  # on top of what torch already maps; unknown (no /proc): no address-space cap
        _set_limit(resource.RLIMIT_AS, vm + limits.memory_mb * (1 << 20))
    _set_limit(resource.RLIMIT_CPU, int(limits.cpu_s), int(limits.cpu_s) + 2)
    _set_limit(resource.RLIMIT_FSIZE, limits.file_mb * (1 << 20))
    _set_limit(resource.RLIMIT_CORE, 0)
    if os.getuid() != 0 and (tasks := _user_tasks()) is not None:  # no fork bombs (root is not limited)
        _set_limit(resource.RLIMIT_NPROC, tasks + limits.tasks)
    try:
        import torch

        torch.set_num_threads(1)
    except Exception:  # noqa: BLE001 - the target reports a missing torch itself
        pass
    try:
        module_name, _, function = request["target"].partition(":")
        value = getattr(importlib.import_module(module_name), function)(*request["args"])
        reply = {"status": "ok", "value": value}
    except BaseException as error:  # noqa: BLE001 - everything is reported, nothing escapes
        reply = _describe(error)
    try:
        data = _dumps(reply, default=str).encode("utf-8", errors="replace")
    except BaseException:  # noqa: BLE001
        data = _dumps({"status": "crash", "type": "TypeError", "message": "unserialisable result"}).encode()
    try:
        view = memoryview(data)
        while view:
            view = view[_write(result_fd, view):]
    finally:
        _exit(0)


def _describe(error: BaseException) -> dict:
    from specgen.errors import SpecError, SpecgenError

    if isinstance(error, SpecError):
        loc = error.location
        return {"status": "error", "error": {
            "message": error.message, "field": error.field, "hint": error.hint,
            "path": None if loc is None else str(loc.path), "line": None if loc is None else loc.line,
            "column": None if loc is None else loc.column}}
    if isinstance(error, SpecgenError):
        return {"status": "error", "error": {"message": str(error), "field": None, "hint": None, "path": None,
                                             "line": None, "column": None}}
    return {"status": "crash", "type": type(error).__name__, "message": str(error)[:2000]}


def _collect(pid: int, result_fd: int, deadline: float) -> tuple[bytes, bool, int | None]:
    """The grandchild's result bytes, whether it ran past the deadline, and its wait status
    when it was reaped here (None: not yet)."""
    chunks, size = [], 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), True, None
        ready, _, _ = select.select([result_fd], [], [], min(remaining, 0.5))
        if ready:
            chunk = os.read(result_fd, 1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                return b"", False, None
            chunks.append(chunk)
    while time.monotonic() < deadline:  # the pipe is closed; the process should be ending
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return b"".join(chunks), False, status
        time.sleep(0.01)
    return b"".join(chunks), True, None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)  # the group was made right after the fork (setpgid below)
    except (ProcessLookupError, PermissionError):
        pass


def _status_of(pid: int, status: int | None) -> tuple[int | None, str | None]:
    if status is None:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return None, None
    if os.WIFSIGNALED(status):
        return None, signal.Signals(os.WTERMSIG(status)).name
    return os.WEXITSTATUS(status), None


def _run(request: dict, scratch: str) -> dict:
    task_dir = tempfile.mkdtemp(prefix="task-", dir=scratch)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            _grandchild(request, write_fd, task_dir)
        finally:
            _exit(70)
    os.close(write_fd)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    try:
        data, timed_out, status = _collect(pid, read_fd, time.monotonic() + request["limits"].timeout_s)
    finally:
        os.close(read_fd)
        _kill_group(pid)  # on a timeout, and whatever the call left running in its group
    exit_code, signame = _status_of(pid, status)
    try:
        with open(os.path.join(task_dir, ".output"), "rb") as output:
            output.seek(0, os.SEEK_END)
            output.seek(max(0, output.tell() - 2000))
            tail = output.read().decode("utf-8", errors="replace")
    except OSError:
        tail = ""
    shutil.rmtree(task_dir, ignore_errors=True)
    if timed_out:
        return {"status": "timeout", "seconds": request["limits"].timeout_s, "output": tail}
    try:
        reply = json.loads(data.decode("utf-8", errors="replace")) if data else None
    except ValueError:
        reply = None
    if isinstance(reply, dict) and "status" in reply:
        return reply
    return {"status": "died", "exit_code": exit_code, "signal": signame, "output": tail}


def main(argv: list[str]) -> int:
    parent, scratch = int(argv[0]), argv[1]

    def parent_died(_signum, _frame):
        shutil.rmtree(scratch, ignore_errors=True)
        _exit(1)

    signal.signal(signal.SIGUSR1, parent_died)
    set_parent_death_signal(signal.SIGUSR1)
    if os.getppid() != parent:
        parent_died(None, None)
    replies = os.fdopen(os.dup(1), "wb")  # see below: the protocol's own descriptor
    os.dup2(2, 1)
    import torch  # noqa: F401 - torch and the check code, once, before any fork

    import specgen.checking  # noqa: F401
    import specgen.inputs  # noqa: F401
    import specgen.reference  # noqa: F401

    # replies go out on a descriptor of their own (made above, before the imports): whatever
    # torch or specgen print to stdout goes to the log (stderr), never into the protocol
    stdin = sys.stdin.buffer
    write_frame(replies, b'{"status": "ready"}')
    while True:
        header = stdin.read(4)
        if len(header) < 4:  # specgen closed the pipe, or died (then no one else removes the folder)
            shutil.rmtree(scratch, ignore_errors=True)
            # nothing left to save: skip the interpreter's teardown of torch (~1 s that specgen's exit
            # waits for, as it closes the sandbox)
            sys.stdout.flush()
            sys.stderr.flush()
            _exit(0)
        request = pickle.loads(stdin.read(int.from_bytes(header, "big")))
        write_frame(replies, json.dumps(_run(request, scratch), default=str).encode())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
