"""Lock entries for ops that keep the reference path (the agent refused, or nothing beat eager).

Without such an entry `specgen build --locked` could not tell "never generated" from "the
agent was asked and has no kernel for this spec", and CI would fail on every op outside the
built-in generator's families. The entry has an empty `kernel` and says why in `reference`;
it is fresh while the spec hash matches, like a kernel entry.

Written through specgen.lock's own locked, atomic read-modify-write. (Better placed in lock.py
as `Lock.write_reference`; until then the `reference` reason survives only until another
writer rewrites the file, after which the entry still marks the op, with a generic reason.)
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..lock import KERNEL_DIR, Lock, LockEntry, _now, _relative  # noqa: F401 - one lock format

GENERIC_REASON = "the agent produced no kernel for this spec"


@dataclass
class ReferenceEntry(LockEntry):
    reference: str = GENERIC_REASON

    def as_json(self):
        data = super().as_json()
        data["reference"] = self.reference
        return data


def is_reference_entry(entry) -> bool:
    return entry is not None and not entry.kernel


def reference_state(lock: Lock, spec) -> tuple[bool, str | None]:
    """(fresh, reason) of the op's reference entry; (False, None) when it has none."""
    entry = lock.entry(spec.name)
    if not is_reference_entry(entry):
        return False, None
    return entry.spec_hash == spec.hash(), _stored_reason(lock, spec.name)


def _stored_reason(lock: Lock, op: str) -> str:
    try:
        raw = json.loads(lock.path.read_text(encoding="utf-8"))["ops"][op]
        return raw.get("reference") or GENERIC_REASON
    except (OSError, ValueError, KeyError, TypeError):
        return GENERIC_REASON


def record_reference(lock: Lock, spec, *, agent: str, model: str | None, reason: str) -> None:
    """Mark the op as running its reference (never replaces a kernel file on disk)."""
    from pathlib import Path

    with lock._exclusive():
        lock.entries = lock._read_entries(lock.path)
        if lock.kernel_path(spec.name).exists():
            return  # a kernel file is there (hand-written?): leave it to the kernel entries
        lock.entries[spec.name] = ReferenceEntry(
            op=spec.name, spec=_relative(Path(spec.path).resolve(), lock.spec_dir), spec_hash=spec.hash(),
            kernel="", kernel_hash="", agent=agent, model=model, created=_now(), records=[],
            reference=" ".join(reason.split())[:500])
        lock._write_lock()
