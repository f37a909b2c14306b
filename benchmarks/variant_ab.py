"""A/B of two builtin schedule variants in one run: the same spec's kernel built with each,
timed side by side at the benchmark shapes (kernel only; the variants are not verified here,
so nothing is locked: this is for choosing defaults, the autotuner verifies what it keeps).

    python benchmarks/variant_ab.py --out DIR --ops gelu_tanh,rmsnorm --a default --b grid \
        [--dtypes bfloat16,float32] [--extra-shapes]

Writes DIR/variant_ab.json and DIR/variant_ab.md (B's time / A's time per row, and the
fraction of the copy bandwidth each reaches).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from builtin_bench import EXTRA_SHAPES  # noqa: E402
from specgen.agents.builtin.emit import variants_named  # noqa: E402
from specgen.agents.builtin.generator import build_source, compile_source  # noqa: E402
from specgen.bench import bench_spec  # noqa: E402
from specgen.fsutil import write_atomic  # noqa: E402
from specgen.spec import load_spec  # noqa: E402

REPS = 30


def ab_rows(spec, a, b, dtypes, shapes) -> list[dict]:
    lib_a = compile_source(spec, build_source(spec, a)).library
    lib_b = compile_source(spec, build_source(spec, b)).library
    directions = ("forward", "backward") if spec.backward == "kernel" else ("forward",)
    rows = []
    for direction in directions:
        result = bench_spec(spec, lib_b, shapes=shapes, dtypes=dtypes, baseline=lib_a, eager=False, compiled=False,
                            directions=(direction,), reps=REPS)
        for row in result.rows:
            rows.append({"op": spec.name, "direction": direction, "dims": row.dims, "dtype": row.dtype,
                         "bytes": row.bytes, "a_us": row.baseline_us, "b_us": row.kernel_us,
                         "a_fraction": row.fraction(row.baseline_us), "b_fraction": row.fraction(row.kernel_us)})
    return rows


def table(rows, a, b) -> str:
    lines = [f"| op | dir | shape | dtype | MB | {a} us | {b} us | {b}/{a} time | {a} % copy | {b} % copy |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        if not (r["a_us"] and r["b_us"]):
            continue
        ratio = r["b_us"] / r["a_us"]
        ratios.append(ratio)
        shape = ",".join(f"{k}={v}" for k, v in r["dims"].items())
        lines.append(f"| {r['op']} | {r['direction']} | {shape} | {r['dtype']} | {r['bytes'] / 1e6:.0f} | "
                     f"{r['a_us']:.1f} | {r['b_us']:.1f} | {ratio:.3f} | {r['a_fraction'] * 100:.0f}% | "
                     f"{r['b_fraction'] * 100:.0f}% |")
    if ratios:
        lines.append("")
        lines.append(f"geometric mean of {b}/{a} time: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} "
                     f"over {len(ratios)} rows (< 1: {b} faster)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ops", required=True)
    parser.add_argument("--a", default="default")
    parser.add_argument("--b", required=True)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--extra-shapes", action="store_true")
    args = parser.parse_args()
    try:
        variant_a, variant_b = variants_named(f"{args.a},{args.b}")
    except ValueError as error:
        parser.error(f"--a/--b: {error}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for op in args.ops.split(","):
        spec = load_spec(REPO / "specs" / f"{op}.yaml")
        shapes = list(spec.benchmark) + (EXTRA_SHAPES.get(op, []) if args.extra_shapes else [])
        rows += ab_rows(spec, variant_a, variant_b, args.dtypes.split(","), shapes)
        write_atomic(args.out / "variant_ab.json", json.dumps({"a": args.a, "b": args.b, "rows": rows}, indent=1))
        write_atomic(args.out / "variant_ab.md", table(rows, args.a, args.b) + "\n")
        print(f"[{op}] done", flush=True)
    print(table(rows, args.a, args.b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
