"""What runs in a task, and how a task's result comes back into the lock (by the client only).

A spec task carries its spec as data (the YAML text, the spec folder's lock and the op's
kernel file: a `payload`), so it runs the same on this host and on a cluster host that
shares no file system. The worker writes them into a scratch folder and runs the one-GPU
code path there unchanged (`specgen build`'s _resolve, `specgen generate`'s generate_one),
so a spec's outcome is exactly that of a one-GPU run; the scratch lock then gives back the
op's entry and kernel, and the client adopts them into the real lock (`adopt`, atomic, under
the folder's flock). Workers never write the real lock.

Other tasks: `compile_task` (nvcc, no GPU: the library comes back keyed by the compile
cache's content hash, and `install_library` puts it into another host's cache under that
key, so a kernel is compiled once per architecture) and `reference_check_task` (a spec's
reference in the sandbox, no GPU).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

from . import context

MAX_PAYLOAD_BYTES = 8 << 20
_STAMP = re.compile(r"^\[\s*[\d.]+s\]\s*")


# ---------------------------------------------------------------------------- payload

def spec_payload(spec) -> dict:
    """The spec's YAML, its folder's lock and its op's kernel, as text."""
    from ..lock import KERNEL_DIR, LOCK_NAME

    path = Path(spec.path).resolve()
    folder = path.parent
    files = {path.name: path.read_text(encoding="utf-8")}
    for rel in (LOCK_NAME, f"{KERNEL_DIR}/{spec.name}.cu"):
        if (folder / rel).is_file():
            files[rel] = (folder / rel).read_text(encoding="utf-8", errors="surrogateescape")
    if sum(len(t) for t in files.values()) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"{spec.name}: the spec, lock and kernel are over {MAX_PAYLOAD_BYTES >> 20} MB")
    return {"op": spec.name, "spec_file": path.name, "folder": str(folder), "files": files}


@contextlib.contextmanager
def scratch_spec(payload: dict):
    """The payload written into a scratch folder; yields (spec, folder). An error raised
    inside names the real spec folder, not the scratch one."""
    from ..spec import load_spec

    folder = Path(tempfile.mkdtemp(prefix=f"specgen-task-{payload['op']}-"))
    try:
        for rel, text in payload["files"].items():
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8", errors="surrogateescape")
        yield load_spec(folder / payload["spec_file"]), folder
    except Exception as error:
        _localize_error(error, folder, payload["folder"])
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _entry_back(folder: Path, op: str) -> dict:
    """The scratch lock's entry for `op` and its kernel file, after the task ran."""
    from ..lock import Lock

    lock = Lock.load(folder)
    entry = lock.entry(op)
    kernel = lock.kernel_path(op)
    return {"entry": entry.as_json() if entry is not None else None,
            "kernel_text": kernel.read_text(encoding="utf-8", errors="surrogateescape") if kernel.is_file() else None}


class _Lines(io.TextIOBase):
    """A console's file: keeps the text, and reports each finished line as progress."""

    def __init__(self, scratch: Path | None = None, where: str | None = None) -> None:
        self.text, self._partial = [], ""
        self.scratch, self.where = scratch, where

    def write(self, data: str) -> int:
        self.text.append(data)
        self._partial += data
        while "\n" in self._partial:
            line, self._partial = self._partial.split("\n", 1)
            line = _STAMP.sub("", line.rstrip())  # the worker's own clock: the client stamps each line
            if line.strip():
                context.report(_localize(line, self.scratch, self.where) if self.scratch else line)
        return len(data)

    def getvalue(self) -> str:
        return "".join(self.text)


def _console(scratch: Path | None = None, where: str | None = None):
    from rich.console import Console

    sink = _Lines(scratch, where)
    return Console(file=sink, width=200, highlight=False, soft_wrap=True, force_terminal=False,
                   color_system=None), sink


def _args(options: dict) -> argparse.Namespace:
    return argparse.Namespace(**options)


def task_options(args) -> dict:
    """The command's options as plain data for a task (what a worker needs to rebuild args)."""
    return {k: v for k, v in vars(args).items() if k != "func" and not callable(v)}


def _ledger_scope(ledger, args=None):
    from .budget import active

    return active(ledger, samples=getattr(args, "samples", 1) or 1, arch=getattr(args, "arch", None))


def _localize_error(error: BaseException, scratch: Path, folder: str) -> None:
    """An error raised in a scratch folder, made to name the real spec folder."""
    import dataclasses

    try:
        error.args = tuple(_localize(a, scratch, folder) for a in error.args)
        for name in ("message", "hint"):
            if isinstance(getattr(error, name, None), str):
                setattr(error, name, _localize(getattr(error, name), scratch, folder))
        location = getattr(error, "location", None)
        if dataclasses.is_dataclass(location) and hasattr(location, "path"):
            error.location = dataclasses.replace(location, path=_localize(str(location.path), scratch, folder))
    except Exception:  # noqa: BLE001 - an error that will not be relabelled keeps its text
        pass


def _localize(text, scratch: Path, folder: str):
    if not isinstance(text, str):
        return text
    for variant in {str(scratch), str(Path(scratch).resolve())}:
        text = text.replace(variant, folder)
    return text


# ---------------------------------------------------------------------------- spec tasks

def build_spec_task(payload: dict, options: dict, ledger=None) -> dict:
    """`specgen build`'s per-op step (reuse, re-verify, generate or tune) for one spec."""
    from ..commands import build

    started = time.monotonic()
    args = _args(options)
    with scratch_spec(payload) as (spec, folder), _ledger_scope(ledger, args):
        console, sink = _console(folder, payload["folder"])
        [result] = build._resolve([spec], args, console)
        back = _entry_back(folder, spec.name)
        where = payload["folder"]
        provenance = json.loads(_localize(json.dumps(result.provenance, default=str), folder, where))
        return {"op": spec.name, "kernel": result.kernel, "provenance": provenance,
                "problem": _localize(result.problem, folder, where), "action": result.action,
                "output": _localize(sink.getvalue(), folder, where), "slot": context.slot(),
                "seconds": time.monotonic() - started, **back}


def generate_spec_task(payload: dict, options: dict, ledger=None) -> dict:
    """`specgen generate`'s per-spec step for one spec: the exit code and the entry it locked."""
    from ..agents.base import AgentRefused
    from ..agents.registry import AgentOptions, create_agent, load_catalog
    from ..commands.generate import generate_one
    from ..errors import EXIT_REJECTED
    from .budget import wrap_agent

    started = time.monotonic()
    args = _args(options)
    with scratch_spec(payload) as (spec, folder), _ledger_scope(ledger, args):
        console, sink = _console(folder, payload["folder"])
        agent_options = AgentOptions(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env,
                                     timeout_s=args.timeout, max_retries=args.retries,
                                     temperature=args.temperature,
                                     transcript=Path(args.transcript) if args.transcript else None,
                                     catalog=load_catalog())
        agent = wrap_agent(create_agent(args.agent, agent_options))
        try:
            code = generate_one(spec, agent, args, console)
        except AgentRefused as refusal:
            console.print(f"  refused: {refusal}")
            code = EXIT_REJECTED
        back = _entry_back(folder, spec.name)
        where = payload["folder"]
        return {"op": spec.name, "code": code, "output": _localize(sink.getvalue(), folder, where),
                "slot": context.slot(), "seconds": time.monotonic() - started, **back}


# ---------------------------------------------------------------------------- the client's side

def adopt(spec, result: dict) -> bool:
    """Put a spec task's entry and kernel into the real lock (atomic writes, kernel first,
    under the spec folder's flock). True when the lock changed. Client only."""
    from ..fsutil import write_atomic
    from ..lock import Lock, LockEntry, kernel_hash, read_kernel

    new = result.get("entry")
    if new is None:
        return False
    lock = Lock.for_spec(spec)
    op = spec.name
    with lock._exclusive():
        lock.entries = Lock._read_entries(lock.path)
        old = lock.entries.get(op)
        kernel = lock.kernel_path(op)
        text = result.get("kernel_text")
        on_disk = read_kernel(kernel) if kernel.is_file() else None
        if old is not None and old.as_json() == new and on_disk == text:
            return False  # reused as it was: the lock is not touched
        if text is not None and on_disk != text:
            write_atomic(kernel, text)  # kernel first: the old lock stays valid until the lock is written
        elif text is None and on_disk is not None and old is not None and old.kernel \
                and kernel_hash(on_disk) == old.kernel_hash:
            kernel.unlink()  # the task removed the kernel this lock wrote (the tuner kept eager)
        lock.entries[op] = LockEntry.from_json(op, new)
        lock._write_lock()
    return True


# ---------------------------------------------------------------------------- CPU tasks

def compile_task(source: str, header_name: str, header_text: str, arch: str | None, name: str) -> dict:
    """Compile a kernel (nvcc, no GPU). Returns its content hash, the compile cache key and
    the library's bytes (or the diagnostics)."""
    from ..toolchain import CompileError, compile_kernel

    with tempfile.TemporaryDirectory(prefix="specgen-inc-") as include:
        (Path(include) / header_name).write_text(header_text)
        try:
            compiled = compile_kernel(source, include_dirs=[Path(include)], arch=arch, name=name,
                                      source_name=f"{name}.cu")
        except CompileError as error:
            return {"ok": False, "diagnostics": str(error)[:4000], "slot": context.slot()}
        return {"ok": True, "source_hash": compiled.source_hash, "cache_key": compiled.cache_key,
                "arch": compiled.arch, "cached": compiled.cached, "library_name": Path(compiled.library).name,
                "library": Path(compiled.library).read_bytes(), "slot": context.slot(),
                "meta": _meta_text(Path(compiled.library))}


def _meta_text(library: Path) -> str | None:
    from ..toolchain.compile import _meta_path

    try:
        return _meta_path(library).read_text()
    except OSError:
        return None


def install_library(result: dict, cache_dir: str | Path | None = None) -> Path:
    """Put a compiled library into this host's compile cache under its content key."""
    from ..fsutil import write_atomic
    from ..toolchain.compile import default_cache_dir

    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / result["library_name"]
    if not target.exists():
        if result.get("meta"):
            from ..toolchain.compile import _meta_path

            write_atomic(_meta_path(target), result["meta"])
        write_atomic(target, result["library"])
    return target


def reference_check_task(payload: dict) -> dict:
    """A spec's reference run once per dtype in the sandbox (no GPU)."""
    from ..checking import check_reference
    from ..spec import load_spec

    real = Path(payload["folder"]) / payload["spec_file"]
    try:  # the same host: the spec itself, so any error names its own file
        same = real.read_text(encoding="utf-8") == payload["files"][payload["spec_file"]]
    except OSError:
        same = False
    if same:
        check_reference(load_spec(real), samples=1)
    else:
        with scratch_spec(payload) as (spec, _):
            check_reference(spec, samples=1)
    return {"op": payload["op"], "ok": True, "slot": context.slot()}
