"""Compare two builtin_bench.json runs: the target summary of each, then the kernel rows that
moved by more than --threshold (same op, direction, shape, dtype).

    python benchmarks/compare_runs.py OLD/builtin_bench.json NEW/builtin_bench.json [--threshold 0.05]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

BIG = 256e6  # rows moving at least this many bytes carry the bandwidth target


def key(row: dict) -> tuple:
    return row["op"], row.get("direction", "forward"), json.dumps(row["dims"], sort_keys=True), row["dtype"]


def summary(rows: list[dict]) -> str:
    timed = [r for r in rows if r.get("kernel_us")]
    big = [r for r in timed if r["bytes"] >= BIG]
    fast_bw = sum(1 for r in big if (r.get("kernel_roofline_fraction") or 0) >= 0.85)
    compiled = [r for r in timed if r.get("compile_us") and not r.get("compile_fallback")]
    ratios = [r["compile_us"] / r["kernel_us"] for r in compiled]
    at_least = sum(1 for x in ratios if x >= 0.97)
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    return (f"rows {len(timed)}; >=256MB at >=85% copy bw: {fast_bw}/{len(big)}; "
            f">=0.97x compile: {at_least}/{len(ratios)}; geomean vs compile {geomean:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--threshold", type=float, default=0.05)
    args = parser.parse_args()
    old = json.loads(args.old.read_text())["rows"]
    new = json.loads(args.new.read_text())["rows"]
    print(f"old: {summary(old)}")
    print(f"new: {summary(new)}")
    before = {key(r): r for r in old}
    for r in new:
        was = before.get(key(r))
        if not (was and was.get("kernel_us") and r.get("kernel_us")):
            continue
        speedup = was["kernel_us"] / r["kernel_us"]
        if abs(speedup - 1) < args.threshold:
            continue
        vs = f"vs compile {r['compile_us'] / r['kernel_us']:.2f}" if r.get("compile_us") else ""
        print(f"{r['op']:15} {r.get('direction', 'forward'):8} {json.dumps(r['dims'], sort_keys=True):28} "
              f"{r['dtype']:10} {was['kernel_us']:8.1f} -> {r['kernel_us']:8.1f} us ({speedup:.2f}x)  "
              f"{(r.get('kernel_roofline_fraction') or 0) * 100:.0f}%  {vs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
