"""The report's data: per op, the lock's entry and its best record, condensed; plus extra
benchmark records (`specgen bench --json` files) and the history of the lock in git.

Everything is plain JSON-able data: `specgen report --json -` prints exactly this, and the
HTML and its charts are drawn from it.
"""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import SpecgenError, UsageError

DIRECTIONS = ("forward", "backward")


def geomean(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _mean(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None


def row_data(row: dict, source: str) -> dict:
    """One benchmark row in the report's keys (those of specgen.bench.BenchRow.as_dict)."""
    keep = ("direction", "dims", "dtype", "bytes", "eager_us", "compile_us", "kernel_us", "baseline_us",
            "roofline_us", "speedup_vs_eager", "speedup_vs_compile", "kernel_roofline_fraction", "compile_fallback",
            "notes")
    data = {key: row.get(key) for key in keep}
    data["direction"] = data["direction"] or "forward"
    kernel, eager, compiled = data["kernel_us"], data["eager_us"], data["compile_us"]
    if data["speedup_vs_eager"] is None and kernel and eager:
        data["speedup_vs_eager"] = eager / kernel
    if data["speedup_vs_compile"] is None and kernel and compiled:
        data["speedup_vs_compile"] = compiled / kernel
    # another kernel timed beside this one (`specgen bench --baseline`, an earlier agent's kernel)
    data["speedup_vs_baseline"] = data["baseline_us"] / kernel if kernel and data["baseline_us"] else None
    if data["kernel_roofline_fraction"] is None and kernel and data["roofline_us"]:
        data["kernel_roofline_fraction"] = data["roofline_us"] / kernel
    for name in ("eager", "compile", "baseline"):
        us = data[f"{name}_us"]
        data[f"{name}_roofline_fraction"] = data["roofline_us"] / us if us and data["roofline_us"] else None
    data["source"] = source
    return data


def summarize_rows(rows: list[dict]) -> dict:
    """Per direction: geomean speedups, mean roofline fraction and the row count."""
    summary = {}
    for direction in DIRECTIONS:
        mine = [r for r in rows if r["direction"] == direction]
        if mine:
            summary[direction] = {"rows": len(mine),
                                  "vs_eager": geomean(r["speedup_vs_eager"] for r in mine),
                                  "vs_compile": geomean(r["speedup_vs_compile"] for r in mine),
                                  "roofline": _mean(r["kernel_roofline_fraction"] for r in mine)}
    return summary


_ORDER = {"forward": 0, "backward": 1, "float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}


def verification_data(record) -> dict | None:
    v = record.verification if record is not None else None
    if not v:
        return None
    tolerances = v.get("tolerance") or v.get("tolerances") or {}
    # a verdict recorded by `specgen verify --record` names its directions and dtypes only in its
    # tolerances' keys ("forward float32"), in the order it checked them
    keyed = [key.split(" ", 1) for key in tolerances if isinstance(key, str) and " " in key]
    keyed.sort(key=lambda pair: (_ORDER.get(pair[0], 9), _ORDER.get(pair[1], 9)))  # the lock sorts its keys
    return {"passed": bool(v.get("passed")), "gpu_arch": record.gpu_arch, "verifier_version": record.verifier_version,
            "cases": v.get("cases", v.get("examples")),
            "dtypes": v.get("dtypes") or list(dict.fromkeys(dtype for _, dtype in keyed)),
            "directions": v.get("directions") or list(dict.fromkeys(direction for direction, _ in keyed)),
            "variant": v.get("variant"),
            "sanitized": v.get("sanitized"),  # None: the record predates the field
            "created": record.created or None,
            "tolerance": [{"key": key, "atol": t.get("spec_atol"), "rtol": t.get("spec_rtol"),
                           "max_atol_used": t.get("max_atol_used")}
                          for key, t in sorted(tolerances.items()) if isinstance(t, dict)]}


def _spec_facts(spec_dir: Path, entry) -> dict:
    """The spec's signature and freshness, when the spec file loads here."""
    from ..lock import Lock
    from ..spec import load_spec

    path = spec_dir / entry.spec
    facts = {"signature": None, "dtypes": [], "lock_state": "unknown", "spec_error": None}
    try:
        spec = load_spec(path)
        facts.update(signature=str(spec.signature), dtypes=list(spec.dtypes), description=spec.description,
                     symbols=spec.signature.symbols())
        if entry.kernel:
            facts["lock_state"] = Lock(spec_dir, {entry.op: entry}).status(spec).state
        else:
            facts["lock_state"] = "fresh" if entry.spec_hash == spec.hash() else "stale"
    except SpecgenError as error:
        facts["spec_error"] = str(error).splitlines()[0]
    return facts


def op_data(spec_dir: Path, entry) -> dict:
    from ..package.provenance import best_record

    record = best_record(entry) if entry.kernel else None
    latest = None
    if entry.kernel and record is None:
        mine = entry.records_for()
        latest = max(mine, key=lambda r: r.created or "") if mine else None
    used = record or latest
    bench = (used.benchmark if used is not None else None) or {}
    rows = [row_data(r, "lock") for r in bench.get("rows", []) if isinstance(r, dict)]
    facts = _spec_facts(spec_dir, entry)
    rank = {symbol: index for index, symbol in enumerate(facts.pop("symbols", []))}
    for row in rows:  # the lock stores dims with sorted keys: back to the signature's order
        if isinstance(row["dims"], dict):
            row["dims"] = dict(sorted(row["dims"].items(), key=lambda item: rank.get(item[0], len(rank))))
    return {"op": entry.op, "spec": entry.spec, "folder": str(spec_dir),
            "path": "kernel" if entry.kernel else "reference",
            "reference_reason": entry.reference, "agent": entry.agent, "model": entry.model,
            "kernel_hash": entry.kernel_hash or None, "created": entry.created or None,
            "verified": record is not None,
            "verification": verification_data(used),
            "benchmark": {"device": bench.get("device"), "copy_gbs": bench.get("copy_gbs"), "rows": rows},
            "summary": summarize_rows(rows), "tuning": tuning_data(entry.tuning), **facts}


def tuning_data(tuning) -> dict | None:
    """The built-in tuner's record, as the report shows it: the chosen variant, whether it was
    verified, and its time beside eager per benchmark row (why a verified kernel was not kept)."""
    if not isinstance(tuning, dict):
        return None
    variant = tuning.get("variant")
    tried = (tuning.get("variants") or {}).get(variant) or {}
    rows = [{"id": r.get("id"), "kernel_us": r.get("kernel_us"), "eager_us": r.get("eager_us"),
             "speedup_vs_eager": r.get("speedup_vs_eager")} for r in tuning.get("rows") or [] if isinstance(r, dict)]
    return {"variant": variant, "decision": tuning.get("decision"), "verified": bool(tried.get("verified")),
            "gpu_arch": (tuning.get("key") or {}).get("gpu_arch"), "rows": rows, "notes": tuning.get("notes") or []}


def spec_folders(paths: list[str | Path]) -> list[Path]:
    """The folders whose lock the report reads: each folder given, or the folder of each spec file."""
    folders: list[Path] = []
    for raw in paths:
        path = Path(raw)
        folder = path if path.is_dir() else path.parent if path.is_file() else None
        if folder is None:
            raise UsageError(f"{path}: no such file or folder")
        if not (folder / "specgen.lock").is_file():
            raise UsageError(f"{folder}: no specgen.lock here; `specgen build` or `specgen generate` writes it")
        if folder.resolve() not in [f.resolve() for f in folders]:
            folders.append(folder)
    return folders


def add_bench_records(ops: list[dict], files: list[str | Path]) -> None:
    """Rows of `specgen bench --json` files join their op (a new op entry when the lock has none)."""
    by_op = {op["op"]: op for op in ops}
    for raw in files:
        path = Path(raw)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise UsageError(f"--bench {path}: not a benchmark record ({error})") from None
        if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
            raise UsageError(f"--bench {path}: not a benchmark record (`specgen bench --json FILE` writes one)")
        name = record.get("op") or path.stem
        op = by_op.get(name)
        if op is None:
            op = by_op[name] = {"op": name, "spec": None, "folder": None, "path": "benchmark only",
                                "agent": None, "model": None, "verified": False, "verification": None,
                                "benchmark": {"device": record.get("device"), "copy_gbs": record.get("copy_gbs"),
                                              "rows": []}, "signature": None, "dtypes": [], "lock_state": "-"}
            ops.append(op)
        op["benchmark"]["rows"] += [row_data(r, str(path)) for r in record["rows"] if isinstance(r, dict)]
        op["benchmark"]["device"] = op["benchmark"].get("device") or record.get("device")
        op["benchmark"]["copy_gbs"] = op["benchmark"].get("copy_gbs") or record.get("copy_gbs")
        op["summary"] = summarize_rows(op["benchmark"]["rows"])


def collect(paths: list[str | Path], *, bench_files=(), history: bool = True) -> dict[str, Any]:
    from .. import __version__
    from ..lock import Lock
    from .history import lock_history

    ops: list[dict] = []
    histories = []
    for folder in spec_folders(paths):
        lock = Lock.load(folder)
        ops += [op_data(folder, lock.entries[name]) for name in sorted(lock.entries)]
        if history:
            histories += lock_history(folder)
    add_bench_records(ops, bench_files)
    devices = sorted({op["benchmark"]["device"] for op in ops if op["benchmark"].get("device")})
    kernels = [op for op in ops if op["path"] == "kernel"]
    all_rows = [r for op in ops for r in op["benchmark"]["rows"]]
    return {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "specgen_version": __version__,
        "folders": [str(f) for f in spec_folders(paths)],
        "devices": devices,
        "totals": {"ops": len(ops), "kernels": len(kernels), "verified": sum(op["verified"] for op in kernels),
                   "reference": sum(op["path"] == "reference" for op in ops), "rows": len(all_rows),
                   "summary": summarize_rows(all_rows)},
        "ops": ops,
        "history": sorted(histories, key=lambda h: h["date"]),
    }
