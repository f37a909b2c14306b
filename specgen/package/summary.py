"""The package README's summary: per op and direction, the geomean speedups over its
benchmark rows and the mean fraction of the copy roofline (what `specgen report` charts)."""
from __future__ import annotations

from ..report.data import geomean


def performance_summary(pkg) -> list[dict]:
    rows = []
    for op in pkg.ops:
        bench = (op.provenance or {}).get("benchmark") or {}
        for direction in ("forward", "backward"):
            mine = [r for r in bench.get("rows") or [] if (r.get("direction") or "forward") == direction]
            if not mine:
                continue
            fractions = [r["kernel_roofline_fraction"] for r in mine
                         if isinstance(r.get("kernel_roofline_fraction"), (int, float))]
            rows.append({"op": op.name, "direction": direction, "rows": len(mine), "device": bench.get("device"),
                         "vs_eager": geomean(r.get("speedup_vs_eager") for r in mine),
                         "vs_compile": geomean(r.get("speedup_vs_compile") for r in mine),
                         "roofline": sum(fractions) / len(fractions) if fractions else None})
    return rows
