"""What the package says about each kernel: the lock's entry and records, condensed.

`op_provenance` turns a lock entry (and its best record) into the plain dict that
`package_model(..., provenance={op: ...})` takes and the templates read:

    {"status": "verified" | "unverified" | "reference",
     "agent", "model", "kernel_hash", "note",
     "verified_on": "sm_90 (NVIDIA H200)" | None, "verifier_version",
     "verification": {"passed", "cases", "tolerances"},          # tolerances: one line of text
     "benchmark": {"device", "copy_gbs", "rows": [{dims, dtype, kernel_us, eager_us, compile_us,
                   speedup_vs_eager, speedup_vs_compile, kernel_roofline_fraction}]}}

Row keys are specgen.bench.BenchRow.as_dict()'s own names, so a benchmark record goes from
the lock to the README unchanged (only the keys the README shows are kept).
"""
from __future__ import annotations

import math
from typing import Any

VERIFIED, UNVERIFIED, REFERENCE = "verified", "unverified", "reference"
ROW_KEYS = ("direction", "dims", "dtype", "kernel_us", "eager_us", "compile_us", "speedup_vs_eager", "speedup_vs_compile",
            "kernel_roofline_fraction")


def best_record(entry, gpu_arch: str | None = None):
    """The passing record of the entry's current kernel: this GPU's arch first, newest first."""
    passing = [r for r in entry.records_for() if r.passed]
    if not passing:
        return None
    return max(passing, key=lambda r: (r.gpu_arch == gpu_arch, bool(r.benchmark), r.created or ""))


def op_provenance(entry, *, gpu_arch: str | None = None, note: str | None = None,
                  symbols: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Provenance of a locked kernel (entry: lock.LockEntry); `symbols` order the benchmark dims."""
    record = best_record(entry, gpu_arch)
    data: dict[str, Any] = {"status": VERIFIED if record else UNVERIFIED, "agent": entry.agent,
                            "model": entry.model, "kernel_hash": entry.kernel_hash, "note": note,
                            "verified_on": None, "verifier_version": None, "verification": None,
                            "benchmark": None}
    if record is None:
        return data
    benchmark = benchmark_summary(record.benchmark, symbols)
    device = (benchmark or {}).get("device")
    data.update(verified_on=record.gpu_arch + (f" ({device})" if device else ""),
                verifier_version=record.verifier_version,
                verification=verification_summary(record.verification),
                benchmark=benchmark)
    return data


def reference_provenance(note: str, agent: str | None = None) -> dict[str, Any]:
    return {"status": REFERENCE, "agent": agent, "model": None, "note": note, "verified_on": None,
            "verification": None, "benchmark": None}


def verification_summary(verification: dict | None) -> dict[str, Any] | None:
    """passed, cases and a one-line tolerance text from the verifier's record (Verdict.to_json)."""
    if not verification:
        return None
    tolerances = verification.get("tolerances") or verification.get("tolerance") or {}  # lock records: "tolerance"
    text = "; ".join(f"{key} atol={t.get('spec_atol', 0):.3g} rtol={t.get('spec_rtol', 0):.3g}"
                     + (f" (widened to {t['max_atol_used']:.3g})"
                        if t.get("max_atol_used", 0) > t.get("spec_atol", 0) else "")
                     for key, t in tolerances.items() if isinstance(t, dict))
    return {"passed": bool(verification.get("passed")),
            "cases": verification.get("cases", verification.get("examples")),  # lock records: "examples"
            "tolerances": text or None}


def benchmark_summary(benchmark: dict | None, symbols=()) -> dict[str, Any] | None:
    """The README's rows; dims in signature order (the lock stores JSON with sorted keys)."""
    if not benchmark or not benchmark.get("rows"):
        return None
    rows = [{key: row.get(key) for key in ROW_KEYS} for row in benchmark["rows"] if isinstance(row, dict)]
    rank = {symbol: index for index, symbol in enumerate(symbols)}
    for row in rows:
        if isinstance(row["dims"], dict):
            row["dims"] = dict(sorted(row["dims"].items(), key=lambda item: rank.get(item[0], len(rank))))
    return {"device": benchmark.get("device"), "copy_gbs": benchmark.get("copy_gbs"), "rows": rows}


def geomean_speedup(provenance: dict, key: str) -> float | None:
    """Geometric mean of `speedup_vs_eager` / `speedup_vs_compile` over the benchmark rows."""
    rows = ((provenance or {}).get("benchmark") or {}).get("rows") or []
    values = [row[key] for row in rows if isinstance(row.get(key), (int, float)) and row[key] > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))
