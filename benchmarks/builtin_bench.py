"""Benchmark the builtin generator's kernels on the GPU: forward and backward, beside eager
PyTorch and torch.compile, with the copy bandwidth of the same run.

    python benchmarks/builtin_bench.py --out DIR [--ops softmax,rmsnorm] [--dtypes bfloat16,float32]
        [--no-tune | --variants default,twopass,wave | --variants "softmax=default,cl256;rmsnorm=default,csmem"]
        [--extra-shapes]

Per op: generate (verify; autotune unless --no-tune), then time with specgen.bench, the one
timing method (a fresh torch.compile per shape, dtype and direction; backward times only
the backward of each; see specgen/bench.py). A failing op is reported and skipped; the JSON
(DIR/builtin_bench.json) and the table (DIR/builtin_bench.md) are written after every op,
so a timeout still leaves the results so far. A row whose torch.compile fell back to eager
says so in its target column and stays out of the geometric mean.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.bench import bench_spec, copy_bandwidth_gbs  # noqa: E402
from specgen.fsutil import write_atomic  # noqa: E402
from specgen.spec import load_spec  # noqa: E402

OPS = ["gelu_tanh", "bias_gelu", "swiglu", "layernorm_gelu", "rmsnorm", "add_rmsnorm", "softmax", "log_softmax",
       "cross_entropy", "rope"]
EXTRA_SHAPES = {  # wide rows and decode sizes the issue asks for, beyond the specs' lists
    "softmax": [{"N": 2048, "D": 65536}, {"N": 1024, "D": 131072}],
    "cross_entropy": [{"N": 2048, "C": 65536}, {"N": 1024, "C": 131072}],
}
REPS = 30


def direction_rows(spec, library, shapes, dtypes, direction) -> list[dict]:
    """specgen.bench's rows for one direction, as this report's plain dicts; an error (a
    backward that fails to run, say) becomes one error row instead of ending the op."""
    try:
        result = bench_spec(spec, library, shapes=shapes, dtypes=dtypes, directions=(direction,), reps=REPS)
    except Exception as error:
        return [{"op": spec.name, "direction": direction, "dims": dict(shapes[0]), "dtype": ",".join(dtypes),
                 "error": f"{type(error).__name__}: {str(error)[:300]}"}]
    keys = ("dims", "dtype", "bytes", "roofline_us", "kernel_us", "eager_us", "compile_us", "compile_seconds",
            "compile_fallback", "notes", "speedup_vs_eager", "speedup_vs_compile", "kernel_roofline_fraction")
    return [{"op": spec.name, "direction": row.direction, **{k: row.as_dict()[k] for k in keys}}
            for row in result.rows]


def lock_benchmark(spec, record, op_rows: list[dict], copy_gbs: float) -> None:
    """Store this run's rows with the kernel's verification record in specs/specgen.lock, so
    the package README and `specgen build`'s summary show them."""
    from dataclasses import replace

    from specgen import lock

    timed = [r for r in op_rows if "error" not in r]
    benchmark = {"op": spec.name, "device": torch.cuda.get_device_name(), "copy_gbs": copy_gbs,
                 "rows": [{**r, "speedup_vs_compile": None} if r.get("compile_fallback") else r for r in timed]}
    lock.add_record(spec, replace(record, benchmark=benchmark, created=""))


def table(rows, copy_gbs) -> str:
    lines = [f"copy bandwidth (same run): {copy_gbs:.0f} GB/s", "",
             "| op | dir | shape | dtype | MB | kernel us | eager us | compile us | x compile | % copy bw | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        shape = ",".join(f"{k}={v}" for k, v in r["dims"].items())
        if r.get("error") or not r.get("kernel_us"):
            lines.append(f"| {r['op']} | {r['direction']} | {shape} | {r['dtype']} | | | | | | | "
                         f"ERROR {r.get('error', 'no kernel time')[:80]} |")
            continue
        k, c = r["kernel_us"], r.get("compile_us")
        speed = c / k if c else None
        frac = r["roofline_us"] / k
        big = r["bytes"] >= 256e6
        misses = []
        if speed is not None and speed < 0.97:
            misses.append("slower than compile")
        if big and frac < 0.85:
            misses.append("<85% copy bw")
        if r.get("compile_fallback"):
            misses.append("compile fell back to eager")
        if speed and not r.get("compile_fallback"):
            ratios.append(speed)
        lines.append(f"| {r['op']} | {r['direction']} | {shape} | {r['dtype']} | {r['bytes'] / 1e6:.0f} | {k:.1f} | "
                     f"{r.get('eager_us') or 0:.1f} | {c or 0:.1f} | {speed or 0:.2f} | {100 * frac:.0f}% | "
                     f"{'MISS: ' + ', '.join(misses) if misses else 'ok'} |")
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines += ["", f"geometric mean speedup vs torch.compile: {geo:.2f}x over {len(ratios)} rows (target 1.3x)"]
    return "\n".join(lines) + "\n"


def variants_per_op(text: str):
    """op -> the variants to tune (None: all of them): `a,b` for every op, or `op=a,b;op2=c,d`
    for the named ops only (the others keep the default variant alone; per op, a name may be a
    combination `cls:name+cls:name`)."""
    from specgen.agents.builtin.schedule import DEFAULT_VARIANT, variant_named, variants_named

    if text.strip() == "recorded":  # each op's committed kernel's variant (regenerating the kernels of record)
        from specgen.agents.builtin.tune import recorded_variant
        from specgen.lock import Lock

        lock = Lock.load(REPO / "specs")
        return lambda op: [variant_named(recorded_variant(lock.entry(op)))]
    if "=" not in text:
        every = variants_named(text) or None
        return lambda op: every
    table = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        op, sep, names = part.partition("=")
        if not sep or not op.strip():
            raise ValueError(f"{part!r}: write op=variant,variant")
        # per op, a combination the lock records ("medium:cl256+split:default") is a name too
        table[op.strip()] = [variant_named(n.strip()) for n in names.split(",") if n.strip()]
    return lambda op: table.get(op, [DEFAULT_VARIANT])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--variants", default="", help="autotune only these variants (comma-separated names), "
                        "or per op: 'op=a,b;op2=a,c' (ops not named: the default variant only), or 'recorded' "
                        "(each op's variant in specs/specgen.lock: regenerating the committed kernels)")
    parser.add_argument("--extra-shapes", action="store_true")
    parser.add_argument("--write-lock", action="store_true", help="write specs/kernels + lock records")
    args = parser.parse_args()
    from specgen.agents.builtin import generate_builtin

    try:
        per_op = variants_per_op(args.variants)
    except ValueError as error:
        parser.error(f"--variants: {error}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtypes = args.dtypes.split(",")
    copy_gbs = copy_bandwidth_gbs()
    rows, report = [], {"copy_gbs": copy_gbs, "device": torch.cuda.get_device_name(), "ops": {}}
    for op in args.ops.split(","):
        started = time.time()
        entry = report["ops"][op] = {}
        try:
            spec = load_spec(REPO / "specs" / f"{op}.yaml")
            gen = generate_builtin(spec, gpu=True, write=args.write_lock, regenerate=False, tune=not args.no_tune,
                                   bench=False, variants=per_op(op))
            entry.update(variant=gen.variant, timings=gen.timings, notes=gen.notes,
                         verdicts={k: v.to_json() for k, v in gen.verdicts.items()})
            shapes = list(spec.benchmark) + (EXTRA_SHAPES.get(op, []) if args.extra_shapes else [])
            shapes = [dict(t) for t in dict.fromkeys(tuple(d.items()) for d in shapes)]  # each shape once
            use = [d for d in dtypes if d in spec.dtypes]
            op_rows = []
            for direction in ("forward", "backward") if spec.backward == "kernel" else ("forward",):
                op_rows += direction_rows(spec, gen.library, shapes, use, direction)
            rows += op_rows
            if args.write_lock and gen.record is not None:
                lock_benchmark(spec, gen.record, op_rows, copy_gbs)
        except Exception as error:
            entry["error"] = f"{type(error).__name__}: {error}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            print(f"[{op}] FAILED: {type(error).__name__}: {str(error)[:500]}", flush=True)
        entry["seconds"] = round(time.time() - started, 1)
        report["rows"] = rows
        write_atomic(out / "builtin_bench.json", json.dumps(report, indent=2, default=str))
        write_atomic(out / "builtin_bench.md", table(rows, copy_gbs))
        print(f"[{op}] done in {entry['seconds']} s", flush=True)
    print(table(rows, copy_gbs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
