"""Lock entries for ops that keep the reference path (the agent refused, or nothing beat eager).

Without such an entry `specgen build --locked` could not tell "never generated" from "the
agent was asked and has no kernel for this spec", and CI would fail on every op outside the
built-in generator's families. The entry has an empty `kernel` and says why in `reference`;
it is fresh while the spec hash matches, like a kernel entry. The entry itself is written by
`Lock.write_reference` (specgen/lock.py), so every writer of the lock keeps the reason.
"""
from __future__ import annotations

from ..lock import Lock

GENERIC_REASON = "the agent produced no kernel for this spec"


def is_reference_entry(entry) -> bool:
    return entry is not None and not entry.kernel


def reference_state(lock: Lock, spec) -> tuple[bool, str | None]:
    """(fresh, reason) of the op's reference entry; (False, None) when it has none."""
    entry = lock.entry(spec.name)
    if not is_reference_entry(entry):
        return False, None
    return entry.spec_hash == spec.hash(), entry.reference or GENERIC_REASON


def record_reference(lock: Lock, spec, *, agent: str, model: str | None, reason: str) -> None:
    """Mark the op as running its reference (never replaces a kernel file on disk)."""
    lock.write_reference(spec, agent, reason, model=model)
    lock.entries = Lock.load(lock.spec_dir).entries
