"""Child processes that die with specgen.

nvcc, `python -m build` and the reference sandbox run as children. When specgen is
interrupted (Ctrl-C, SIGTERM) it stops them itself; when it is killed outright (SIGKILL,
the OOM killer) it cannot, so every such child runs under a small guard process:

    specgen ──> guard (python -I procguard.py) ──> the command, in its own process group

The guard asks the kernel for a signal when specgen dies (prctl PR_SET_PDEATHSIG, SIGUSR1),
and on it kills the command's whole process group (nvcc's cicc and ptxas with it) and removes
the scratch folders it was given (specgen, dead, cannot). SIGTERM, SIGINT or SIGHUP from
specgen stop the group only: specgen removes its own folders. `run_guarded` is the caller's side: output, a wall-clock
timeout, and the same clean-up when the caller itself is interrupted.

Linux only for the death signal; elsewhere the guard still stops the group on a timeout or
an interrupt of the caller.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
PARENT_DIED = signal.SIGUSR1  # the guard's death signal: specgen is gone, clean up after it
GRACE_S = 5.0  # how long the guard gets to stop its group before it is killed itself


def set_parent_death_signal(signum: int = signal.SIGKILL) -> bool:
    """Ask Linux to send `signum` to this process when its parent dies. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def guarded(argv: Sequence[str], *, cleanup: Sequence[str | Path] = ()) -> list[str]:
    """`argv` wrapped in the guard, for a child of this process."""
    command = [sys.executable, "-I", str(Path(__file__).resolve()), "--parent", str(os.getpid())]
    for folder in cleanup:
        command += ["--cleanup", str(folder)]
    return command + ["--", *map(str, argv)]


def stop(process: subprocess.Popen, grace: float = GRACE_S) -> None:
    """Stop a guarded child: SIGTERM lets the guard kill its group and clean up; SIGKILL after `grace`."""
    if process.poll() is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    except ProcessLookupError:
        pass


def run_guarded(argv: Sequence[str], *, cwd: str | Path | None = None, env: dict | None = None,
                timeout: float | None = None, cleanup: Sequence[str | Path] = (),
                on_line=None) -> tuple[int | None, str]:
    """Run `argv` under the guard; (returncode, stdout+stderr). returncode None: it timed out and was stopped.

    Any exception in the caller (KeyboardInterrupt, SIGTERM turned into one) stops the child
    and its whole process group before it propagates. `on_line(text)` sees each output line
    as it comes (progress); its errors are ignored.
    """
    process = subprocess.Popen(guarded(argv, cleanup=cleanup), cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace",
                               start_new_session=True)
    if on_line is not None:
        return _run_streaming(process, timeout, on_line)
    try:
        out, _ = process.communicate(timeout=timeout)
        return process.returncode, out
    except subprocess.TimeoutExpired:
        stop(process)
        out, _ = process.communicate()
        return None, out
    except BaseException:
        stop(process)
        raise


def _run_streaming(process, timeout, on_line) -> tuple[int | None, str]:
    import threading

    lines: list[str] = []

    def pump():
        for line in process.stdout:
            lines.append(line)
            try:
                on_line(line.rstrip("\n"))
            except Exception:  # noqa: BLE001 - progress must never break the build
                pass

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        process.wait(timeout=timeout)
        reader.join()
        return process.returncode, "".join(lines)
    except subprocess.TimeoutExpired:
        stop(process)
        reader.join(10)
        return None, "".join(lines)
    except BaseException:
        stop(process)
        raise


# ---------------------------------------------------------------------------- the guard itself

def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(folders: list[str]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _guard(argv: list[str]) -> int:
    parent, cleanup, command = None, [], []
    index = 0
    while index < len(argv):
        if argv[index] == "--parent":
            parent, index = int(argv[index + 1]), index + 2
        elif argv[index] == "--cleanup":
            cleanup.append(argv[index + 1])
            index += 2
        elif argv[index] == "--":
            command = argv[index + 1:]
            break
        else:
            print(f"procguard: unknown argument {argv[index]!r}", file=sys.stderr)
            return 2
    child: subprocess.Popen | None = None

    def on_signal(signum, _frame):
        if child is not None:
            _kill_group(child.pid)
        if signum == PARENT_DIED:
            _remove(cleanup)
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, PARENT_DIED):
        signal.signal(signum, on_signal)
    set_parent_death_signal(PARENT_DIED)
    if parent is not None and os.getppid() != parent:  # specgen died before the death signal was set
        _remove(cleanup)
        return 128 + signal.SIGKILL
    try:
        # its own process group, so one killpg stops it and everything it starts; and a death
        # signal of its own, should the guard be killed outright
        child = subprocess.Popen(command, start_new_session=True,
                                 preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL))
    except OSError as error:
        print(f"cannot run {command[0] if command else '(nothing)'}: {error}", file=sys.stderr)
        return 127
    code = child.wait()
    _kill_group(child.pid)  # whatever the command left running in its group
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(_guard(sys.argv[1:]))
