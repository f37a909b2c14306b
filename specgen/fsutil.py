"""Atomic file writes: a reader sees the old file or the new one, never half of either.

The new file gets the mode of the file it replaces, or (a new file) the mode the user's
umask gives, as `open()` would: a lock or a kernel written here is as readable by a
teammate's checkout or a CI user as any other file the user writes (mkstemp alone makes
0600 files).
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but brief)
    os.umask(mask)
    return mask


def new_file_mode(path: Path) -> int:
    """The mode a write of `path` should leave: the existing file's, else 0666 & ~umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~current_umask()


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to `path` atomically; a path that cannot be written is a UsageError (exit 2)."""
    from .errors import UsageError

    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; a file is written here")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = new_file_mode(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
