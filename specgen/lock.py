"""The lock: `specs/kernels/<op>.cu` beside `specs/specgen.lock` (docs/ARCHITECTURE.md "The lock").

The lock is JSON with sorted keys, one entry per op:

    {"version": 1,
     "ops": {"softmax": {"spec": "softmax.yaml", "spec_hash": "...",
                         "kernel": "kernels/softmax.cu", "kernel_hash": "...",
                         "agent": "builtin", "model": null, "created": "2025-...Z",
                         "records": [{"kernel_hash": "...", "verifier_version": "1",
                                      "gpu_arch": "sm_90", "verification": {...},
                                      "benchmark": {...}}],
                         "tuning": {"key": {...}, "variant": "...", "decision": "kernel",
                                    "rows": [...], "variants": {...}, ...}}}}

Writes are atomic and ordered: the kernel file first, the lock last, so an interruption at
any point leaves the previous lock valid (the new kernel then reads as hand-edited, which
only asks for a re-verification). A kernel whose hash differs from its entry was edited by
hand and is never overwritten without `regenerate=True`. Only a machine with a GPU writes
verification records. An entry written by the builtin generator's tuner also keeps its
`tuning` record (specgen/agents/builtin/tune.py): the key it is valid under, every variant
tried with its times per benchmark row, the chosen one, and the keep-eager decision; it is
written, like a verification record, only on a machine with a GPU.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

from .errors import Rejected
from .fsutil import write_atomic

LOCK_NAME = "specgen.lock"
KERNEL_DIR = "kernels"
LOCK_VERSION = 1

MISSING, FRESH, STALE, HAND_EDITED = "missing", "fresh", "stale", "hand-edited"


class LockError(Rejected):
    """The lock refuses a write (e.g. it would overwrite a hand-edited kernel) or cannot be read."""


def kernel_hash(source: str) -> str:
    """sha256 of the kernel text as written to disk (UTF-8)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def read_kernel(path: Path) -> str:
    """A kernel file's text; LockError (not a traceback) for a folder, binary data or a read error."""
    if path.is_dir():
        raise LockError(f"{path}: is a folder, not a kernel file; move it away")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise LockError(f"{path}: cannot read the kernel ({error.strerror or error})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise LockError(f"{path}: the kernel is not UTF-8 text ({error.reason} at byte {error.start}); "
                        f"restore it from version control") from None


def gpu_available() -> bool:
    """Whether this machine may write verification records (tests monkeypatch this)."""
    if not nvidia_device_present():
        return False  # known without importing torch (~4 s of every CPU-only `specgen build --locked`)
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no torch, broken driver: no GPU as far as the lock is concerned
        return False


# A CUDA device is reached through one of these (Linux: the driver's nodes; WSL2: /dev/dxg)
NVIDIA_DEVICE_PATHS = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg")


def nvidia_device_present() -> bool:
    """False only where no GPU can be: Linux without any NVIDIA device node or driver entry.
    Elsewhere (other systems) torch is asked."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(path) for path in NVIDIA_DEVICE_PATHS)


@dataclass(frozen=True)
class Record:
    """One verification and/or benchmark, valid for one kernel, verifier version and GPU arch."""

    kernel_hash: str
    verifier_version: str
    gpu_arch: str
    verification: dict[str, Any] | None = None  # examples, dtypes, shapes, tolerance, max errors, passed
    benchmark: dict[str, Any] | None = None  # {"rows": [...]}
    created: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kernel_hash, self.verifier_version, self.gpu_arch)

    @property
    def passed(self) -> bool:
        return bool(self.verification and self.verification.get("passed"))

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> "Record":
        return Record(**{k: data.get(k) for k in ("kernel_hash", "verifier_version", "gpu_arch",
                                                   "verification", "benchmark")},
                      created=data.get("created", ""))


@dataclass
class LockEntry:
    op: str
    spec: str  # spec file, relative to the spec folder
    spec_hash: str
    kernel: str  # kernel file, relative to the spec folder
    kernel_hash: str
    agent: str
    model: str | None
    created: str
    records: list[Record] = field(default_factory=list)
    reference: str | None = None  # set when the op keeps its reference path: why (no kernel file)
    tuning: dict[str, Any] | None = None  # the builtin tuner's record (agents/builtin/tune.py)

    def records_for(self, kernel_hash: str | None = None) -> list[Record]:
        wanted = kernel_hash or self.kernel_hash
        return [r for r in self.records if r.kernel_hash == wanted]

    def verified_on(self, gpu_arch: str | None = None) -> bool:
        return any(r.passed and (gpu_arch is None or r.gpu_arch == gpu_arch) for r in self.records_for())

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("op")
        data["records"] = [r.as_json() for r in self.records]
        if self.reference is None:
            data.pop("reference")  # kernel entries keep the version-1 layout
        if self.tuning is None:
            data.pop("tuning")
        return data

    @staticmethod
    def from_json(op: str, data: dict[str, Any]) -> "LockEntry":
        return LockEntry(op=op, spec=data["spec"], spec_hash=data["spec_hash"], kernel=data["kernel"],
                         kernel_hash=data["kernel_hash"], agent=data.get("agent", "unknown"),
                         model=data.get("model"), created=data.get("created", ""),
                         records=[Record.from_json(r) for r in data.get("records", [])],
                         reference=data.get("reference"), tuning=data.get("tuning"))


@dataclass(frozen=True)
class LockStatus:
    op: str
    state: str  # missing | fresh | stale | hand-edited
    reason: str
    kernel_path: Path
    entry: LockEntry | None = None

    @property
    def needs_generation(self) -> bool:
        return self.state in (MISSING, STALE)

    def __str__(self) -> str:
        return f"{self.op}: {self.state} ({self.reason})"


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_dir(spec) -> Path:
    if spec.path is None:
        raise LockError(f"spec {spec.name!r} has no file, so it has no spec folder to lock into")
    return Path(spec.path).resolve().parent


class Lock:
    """The lock of one spec folder. Reads are cheap; every write re-reads the file under an
    advisory lock on the folder, so two processes locking different ops do not lose entries."""

    def __init__(self, spec_dir: str | Path, entries: dict[str, LockEntry] | None = None):
        self.spec_dir = Path(spec_dir)
        self.entries: dict[str, LockEntry] = entries or {}

    # ------------------------------------------------------------------ reading
    @property
    def path(self) -> Path:
        return self.spec_dir / LOCK_NAME

    def kernel_path(self, op: str) -> Path:
        return self.spec_dir / KERNEL_DIR / f"{op}.cu"

    @classmethod
    def load(cls, spec_dir: str | Path) -> "Lock":
        spec_dir = Path(spec_dir)
        return cls(spec_dir, cls._read_entries(spec_dir / LOCK_NAME))

    @classmethod
    def for_spec(cls, spec) -> "Lock":
        return cls.load(_spec_dir(spec))

    @staticmethod
    def _read_entries(path: Path) -> dict[str, LockEntry]:
        if not path.exists() and not path.is_symlink():
            return {}
        if path.is_dir():
            raise LockError(f"{path}: is a folder, not a specgen lock; move it away (the lock is a JSON file)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise LockError(f"{path}: cannot read the lock ({error.strerror or error})") from None
        except (ValueError, UnicodeDecodeError) as error:
            raise LockError(f"{path}: not a valid specgen lock ({type(error).__name__}: {error}); "
                            f"restore it from version control, or delete it and run `specgen generate`") from None
        version = data.get("version") if isinstance(data, dict) else None
        if version != LOCK_VERSION:
            raise LockError(f"{path}: lock version {version!r}, but this specgen reads version {LOCK_VERSION} only. "
                            f"If another specgen wrote it, use that version; to start over, move the lock away "
                            f"and run `specgen generate` (nothing here can rewrite a lock it cannot read)")
        try:
            ops = data.get("ops", {})
            return {op: LockEntry.from_json(op, e) for op, e in ops.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise LockError(f"{path}: not a valid specgen lock ({type(error).__name__}: {error}); "
                            f"restore it from version control, or delete it and run `specgen generate`") from None

    def entry(self, op: str) -> LockEntry | None:
        return self.entries.get(op)

    def status(self, spec) -> LockStatus:
        op = spec.name
        kernel = self.kernel_path(op)
        entry = self.entries.get(op)
        if not kernel.exists():
            reason = "no kernel file" if entry is None else f"{kernel.name} is listed in the lock but missing"
            return LockStatus(op, MISSING, reason, kernel, entry)
        actual = kernel_hash(read_kernel(kernel))
        if entry is None:
            return LockStatus(op, HAND_EDITED, f"{kernel.name} exists but has no lock entry", kernel, None)
        if actual != entry.kernel_hash:
            return LockStatus(op, HAND_EDITED, f"{kernel.name} differs from the locked kernel "
                                               f"(sha256 {actual[:12]} != {entry.kernel_hash[:12]}): re-verify it",
                              kernel, entry)
        if entry.spec_hash != spec.hash():
            return LockStatus(op, STALE, "the spec changed since the kernel was generated", kernel, entry)
        return LockStatus(op, FRESH, f"kernel by {entry.agent}" + (f" ({entry.model})" if entry.model else ""),
                          kernel, entry)

    # ------------------------------------------------------------------ writing
    def write_kernel(self, spec, source: str, *, agent: str, model: str | None = None,
                     records: Iterable[Record] = (), regenerate: bool = False,
                     tuning: dict[str, Any] | None = None) -> Path:
        """Write `kernels/<op>.cu` then the lock entry; refuse to overwrite a hand-edited kernel."""
        op = spec.name
        new_hash = kernel_hash(source)
        with self._exclusive():
            self.entries = self._read_entries(self.path)
            status = self.status(spec)
            if status.state == HAND_EDITED and not regenerate:
                raise LockError(f"{status.kernel_path}: {status.reason}; refusing to overwrite a hand-edited "
                                f"kernel. Verify it (`specgen verify`), or pass --regenerate to replace it")
            records = [self._checked(r, new_hash) for r in records]
            _check_tuning(tuning)
            kernel = self.kernel_path(op)
            write_atomic(kernel, source)  # kernel first: the old lock stays valid until the next line
            self.entries[op] = LockEntry(op=op, spec=_relative(Path(spec.path).resolve(), self.spec_dir),
                                         spec_hash=spec.hash(), kernel=f"{KERNEL_DIR}/{op}.cu",
                                         kernel_hash=new_hash, agent=agent, model=model, created=_now(),
                                         records=_merge([], records), tuning=tuning)
            self._write_lock()
        return kernel

    def write_reference(self, spec, agent: str, reason: str, *, model: str | None = None,
                        tuning: dict[str, Any] | None = None, replace_kernel: bool = False) -> bool:
        """Record that the op keeps its reference path (its agent refused, or nothing beat
        eager): an entry with no kernel and the reason, fresh while the spec hash matches.
        A kernel file already on disk is left alone (returns False): it may be hand-written;
        with `replace_kernel` a kernel this lock wrote (its hash matches the entry) is removed
        first (the tuner found it slower than eager), a hand-edited one still never is."""
        op = spec.name
        with self._exclusive():
            self.entries = self._read_entries(self.path)
            _check_tuning(tuning)
            kernel = self.kernel_path(op)
            if kernel.exists():
                entry = self.entries.get(op)
                if not (replace_kernel and entry is not None and entry.kernel
                        and kernel_hash(read_kernel(kernel)) == entry.kernel_hash):
                    return False
                kernel.unlink()  # kernel first: a lock naming a missing kernel only asks to regenerate
            self.entries[op] = LockEntry(op=op, spec=_relative(Path(spec.path).resolve(), self.spec_dir),
                                         spec_hash=spec.hash(), kernel="", kernel_hash="", agent=agent,
                                         model=model, created=_now(), records=[],
                                         reference=" ".join(reason.split())[:500] or "no kernel for this spec",
                                         tuning=tuning)
            self._write_lock()
        return True

    def add_record(self, spec, record: Record) -> None:
        """Add (or replace, same key) a record for the op's current, locked kernel."""
        with self._exclusive():
            self.entries = self._read_entries(self.path)
            entry = self.entries.get(spec.name)
            if entry is None:
                raise LockError(f"{self.path}: no entry for {spec.name!r}; write its kernel first")
            record = self._checked(record, entry.kernel_hash)
            entry.records = _merge(entry.records, [record])
            self._write_lock()

    def _checked(self, record: Record, expected_hash: str) -> Record:
        if record.kernel_hash != expected_hash:
            raise LockError(f"record for kernel {record.kernel_hash[:12]} does not match the kernel "
                            f"{expected_hash[:12]} it would be stored with")
        if record.verification is not None and not gpu_available():
            raise LockError("a machine without a GPU never writes a verification record")
        _check_physics(record)
        return record if record.created else Record(**{**asdict(record), "created": _now()})

    def to_json_text(self) -> str:
        data = {"version": LOCK_VERSION,
                "ops": {op: self.entries[op].as_json() for op in sorted(self.entries)}}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def _write_lock(self) -> None:
        write_atomic(self.path, self.to_json_text())

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """An advisory lock on the spec folder for the read-modify-write of the lock file."""
        self.spec_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.spec_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _check_tuning(tuning: dict[str, Any] | None) -> None:
    """A tuning record names verified variants and GPU times: only a GPU machine writes one."""
    if tuning is not None and not gpu_available():
        raise LockError("a machine without a GPU never writes a tuning record")


def _check_physics(record: Record) -> None:
    """A benchmark that a timed output or physics rejected never reaches the lock."""
    from .verify.physics import PHYSICS_MARGIN

    for row in (record.benchmark or {}).get("rows", []) or []:
        where = f"{row.get('direction', 'forward')} {row.get('dtype')} {row.get('dims')}"
        if row.get("rejected"):
            raise LockError(f"the benchmark rejected kernel {record.kernel_hash[:12]} at {where}: "
                            f"{str(row['rejected'])[:300]}")
        kernel_us, floor_us = row.get("kernel_us"), row.get("floor_us")
        if kernel_us is not None and floor_us and kernel_us * PHYSICS_MARGIN < floor_us:
            raise LockError(f"kernel {record.kernel_hash[:12]} timed {kernel_us:.2f} us at {where}, under the "
                            f"physics floor of {floor_us:.2f} us: it skips work, and no such record is written")


def _merge(existing: list[Record], new: Iterable[Record]) -> list[Record]:
    by_key = {r.key: r for r in existing}
    for record in new:
        by_key[record.key] = record
    return sorted(by_key.values(), key=lambda r: r.key)


def _relative(path: Path, folder: Path) -> str:
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------- conveniences

def status(spec) -> LockStatus:
    return Lock.for_spec(spec).status(spec)


def write_kernel(spec, source: str, *, agent: str, model: str | None = None, records: Iterable[Record] = (),
                 regenerate: bool = False, tuning: dict[str, Any] | None = None) -> Path:
    return Lock.for_spec(spec).write_kernel(spec, source, agent=agent, model=model, records=records,
                                            regenerate=regenerate, tuning=tuning)


def add_record(spec, record: Record) -> None:
    Lock.for_spec(spec).add_record(spec, record)


def write_reference(spec, agent: str, reason: str, *, model: str | None = None,
                    tuning: dict[str, Any] | None = None, replace_kernel: bool = False) -> bool:
    return Lock.for_spec(spec).write_reference(spec, agent, reason, model=model, tuning=tuning,
                                               replace_kernel=replace_kernel)
