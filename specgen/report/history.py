"""The history of a spec folder's lock across its git commits: per commit, per op, the
geomean speedups and mean roofline fraction of the records then locked. No git (or no
commits of the lock): no history, and the report says so."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .data import geomean, _mean

MAX_COMMITS = 100


def _git(folder: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def summarize_lock(data: dict) -> dict:
    ops = {}
    for op, entry in (data.get("ops") or {}).items():
        records = [r for r in entry.get("records") or [] if r.get("kernel_hash") == entry.get("kernel_hash")]
        rows = [row for r in records if (r.get("verification") or {}).get("passed")
                for row in ((r.get("benchmark") or {}).get("rows") or [])]
        if not rows:
            continue
        ops[op] = {direction: {"vs_eager": geomean(r.get("speedup_vs_eager") for r in mine),
                               "vs_compile": geomean(r.get("speedup_vs_compile") for r in mine),
                               "roofline": _mean(r.get("kernel_roofline_fraction") for r in mine)}
                   for direction in ("forward", "backward")
                   if (mine := [r for r in rows if (r.get("direction") or "forward") == direction])}
    return ops


def lock_history(folder: Path) -> list[dict]:
    """[{commit, date, subject, folder, ops: {op: {direction: {vs_eager, vs_compile, roofline}}}}], oldest first."""
    folder = Path(folder)
    log = _git(folder, "log", f"-{MAX_COMMITS}", "--format=%H%x09%cI%x09%s", "--", "specgen.lock")
    if not log:
        return []
    prefix = (_git(folder, "rev-parse", "--show-prefix") or "").strip()
    points = []
    for line in reversed(log.strip().splitlines()):
        commit, date, subject = (line.split("\t", 2) + ["", ""])[:3]
        text = _git(folder, "show", f"{commit}:{prefix}specgen.lock")
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            continue
        ops = summarize_lock(data)
        forward = [s["forward"]["vs_compile"] for s in ops.values() if (s.get("forward") or {}).get("vs_compile")]
        points.append({"commit": commit[:12], "date": date, "subject": subject[:120], "folder": str(folder),
                       "ops": ops, "forward_vs_compile": geomean(forward)})
    return points
