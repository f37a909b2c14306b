"""A/B of builtin schedule variants in one run: the same spec's kernel built with A and with
each B, timed side by side at the benchmark shapes (kernel only; the variants are not
verified here, so nothing is locked: this is for choosing defaults, the autotuner verifies
what it keeps). Every (op, variant) source is compiled up front, in parallel.

    python benchmarks/variant_ab.py --out DIR --ops gelu_tanh,rmsnorm --a default --b wave,cl256 \
        [--dtypes bfloat16,float32] [--extra-shapes] [--verify]

Two names stand for sources rather than variants: `committed` (the lock's kernel,
specs/kernels/<op>.cu) and `recorded` (the generator's source now, at the variant the lock
records): `--a committed --b recorded` measures what a generator change does to the kernels of
record before they are regenerated.

--verify first runs the verifier (every dtype, the same cases the generator's lock records
need) on A and each B, and writes DIR/variant_verify.json; without --b it only verifies.

Each B is timed in the same call as A (A is timed again beside each B: its repeats show the
run-to-run noise). Writes DIR/variant_ab.json and DIR/variant_ab.md (each B's time / A's
time per row, and the fraction of the copy bandwidth each reaches).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from builtin_bench import EXTRA_SHAPES  # noqa: E402
from specgen.agents.builtin.schedule import DEFAULT_VARIANT, variant_named  # noqa: E402
from specgen.agents.builtin.generator import build_source, compile_many  # noqa: E402
from specgen.bench import bench_spec  # noqa: E402
from specgen.fsutil import write_atomic  # noqa: E402
from specgen.spec import load_spec  # noqa: E402

REPS = 30


def build_all(specs: list, variants: list) -> dict:
    """{(op, variant name): (spec, source)}, built in this thread: tracing the reference
    (make_fx) is not thread-safe."""
    return {(spec.name, v.name): (spec, source_of(spec, v)) for spec in specs for v in variants}


class Named:
    """A source that is not a variant: `committed` or `recorded` (see the module docstring)."""

    def __init__(self, name: str):
        self.name = name


SOURCE_NAMES = ("committed", "recorded")


def recorded_variant(spec):
    """The variant the lock records for `spec`'s kernel (the default when none is recorded)."""
    from specgen.lock import Lock

    entry = Lock.load(REPO / "specs").entries.get(spec.name)
    names = [r.verification["variant"] for r in (entry.records if entry else [])
             if r.verification and r.verification.get("variant")]
    return variant_named(names[-1]) if names else DEFAULT_VARIANT


def source_of(spec, variant) -> str:
    if variant.name == "committed":
        return (REPO / "specs" / "kernels" / f"{spec.name}.cu").read_text()
    if variant.name.split("~")[0] == "recorded":  # with any overrides of its fields
        return build_source(spec, with_fields(recorded_variant(spec), variant.name))
    return build_source(spec, variant)


def named(names: str) -> list:
    """Variants (plain, or combined per shape class: `few:fewblock+medium:twopass`) and source
    names, in the order given; ValueError for an unknown name. A variant may carry field
    overrides for an experiment the tuner does not try: `regs16~min_threads=2048~items_cap=2`."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    found = []
    for name in wanted:
        base = name.split("~")[0]
        if base == "committed" and name != base:
            raise ValueError(f"{name!r}: the committed kernel has no fields to override")
        if base in SOURCE_NAMES:  # `recorded~...`: checked against the default now, applied per op
            with_fields(DEFAULT_VARIANT, name)
            found.append(Named(name))
        else:
            found.append(with_fields(variant_named(base), name))
    return found


def with_fields(variant, name: str):
    """`variant` with the field overrides of `name` (`base~field=value~...`: ints, true/false, or
    strings) replaced, named by the whole text; `variant` itself when `name` has none."""
    pairs = name.split("~")[1:]
    fields = {f.name: f for f in dataclasses.fields(variant)}
    changes = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        if key not in fields or key == "name" or not text:
            raise ValueError(f"{name!r}: '{pair}' is not field=value of a Variant ({', '.join(fields)})")
        current = getattr(variant, key)
        if isinstance(current, bool):
            if text not in ("true", "false"):
                raise ValueError(f"{name!r}: {key} takes true or false, not {text!r}")
            changes[key] = text == "true"
        elif isinstance(current, int):
            changes[key] = int(text)
        else:
            changes[key] = text
    return dataclasses.replace(variant, name=name, **changes) if pairs else variant


def compile_all(sources: dict) -> dict:
    """{(op, variant name): library}, nvcc running in parallel; a compile error is raised."""
    results = compile_many(list(sources.values()))
    for result in results:
        if isinstance(result, Exception):
            raise result
    return {key: result.library for key, result in zip(sources, results)}


def verify_all(sources: dict, out: Path) -> dict:
    """{"op/variant": verdict JSON} for each (op, variant), written to out/variant_verify.json."""
    from specgen.verify import verify_kernel

    results = {}
    for (op, name), (spec, source) in sources.items():
        verdict = verify_kernel(spec, source)
        results[f"{op}/{name}"] = verdict.to_json()
        print(f"[verify] {op}/{name}: {'PASS' if verdict.passed else 'FAIL'} "
              f"({verdict.cases} cases) {'' if verdict.passed else verdict.summary()[:400]}", flush=True)
        write_atomic(out / "variant_verify.json", json.dumps(results, indent=1, default=str))
    return results


def ab_rows(spec, a, bs, libraries: dict, dtypes, shapes) -> list[dict]:
    """One row per (direction, shape, dtype): A's time beside each B's (keys a_us[b], b_us[b]).
    A library None (failed verification) is not timed."""
    directions = ("forward", "backward") if spec.backward == "kernel" else ("forward",)
    rows: dict[tuple, dict] = {}
    lib_a = libraries[(spec.name, a.name)]
    if lib_a is None:
        return []
    for b in bs:
        if libraries[(spec.name, b.name)] is None:
            continue
        for direction in directions:
            result = bench_spec(spec, libraries[(spec.name, b.name)], shapes=shapes, dtypes=dtypes, baseline=lib_a,
                                eager=False, compiled=False, directions=(direction,), reps=REPS)
            for r in result.rows:
                key = (direction, tuple(r.dims.items()), r.dtype)
                row = rows.setdefault(key, {"op": spec.name, "direction": direction, "dims": r.dims, "dtype": r.dtype,
                                            "bytes": r.bytes, "copy_gbs": r.copy_gbs, "a_us": {}, "b_us": {}})
                row["a_us"][b.name], row["b_us"][b.name] = r.baseline_us, r.kernel_us
    return list(rows.values())


def _fraction(row, us) -> float:
    return row["bytes"] / (row["copy_gbs"] * 1e9) / (us * 1e-6) if us else 0.0


def table(rows, a: str, bs: list[str]) -> str:
    head = f"| op | dir | shape | dtype | MB | {a} us | {a} % copy | " + " | ".join(
        f"{b} us | {b}/{a} | {b} % copy" for b in bs) + " |"
    lines = [head, "|" + "---|" * (7 + 3 * len(bs))]
    ratios: dict[str, list[float]] = {b: [] for b in bs}
    for r in rows:
        a_times = [t for t in r["a_us"].values() if t]
        if not a_times:
            continue
        a_us = sorted(a_times)[len(a_times) // 2]  # A's median over its repeats
        shape = ",".join(f"{k}={v}" for k, v in r["dims"].items())
        cells = [r["op"], r["direction"], shape, r["dtype"], f"{r['bytes'] / 1e6:.0f}", f"{a_us:.1f}",
                 f"{_fraction(r, a_us) * 100:.0f}%"]
        for b in bs:
            b_us = r["b_us"].get(b)
            if not b_us:
                cells += ["-", "-", "-"]
                continue
            ratio = b_us / r["a_us"][b]  # against A timed in the same call
            ratios[b].append(ratio)
            cells += [f"{b_us:.1f}", f"{ratio:.3f}", f"{_fraction(r, b_us) * 100:.0f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for b, values in ratios.items():
        if values:
            lines.append(f"geometric mean of {b}/{a} time: {math.exp(sum(map(math.log, values)) / len(values)):.3f} "
                         f"over {len(values)} rows (< 1: {b} faster)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ops", required=True, help="op names of specs/, or spec paths (.yaml) from the repo root")
    parser.add_argument("--a", default="default")
    parser.add_argument("--b", default="", help="one or more variants, comma-separated")
    parser.add_argument("--verify", action="store_true", help="verify A and each B first")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--extra-shapes", action="store_true")
    args = parser.parse_args()
    try:
        variant_a, *variants_b = named(f"{args.a},{args.b}")
    except ValueError as error:
        parser.error(f"--a/--b: {error}")
    if not variants_b and not args.verify:
        parser.error("--b: name at least one variant (or --verify only)")
    args.out.mkdir(parents=True, exist_ok=True)
    specs = [load_spec(REPO / op if op.endswith(".yaml") else REPO / "specs" / f"{op}.yaml")  # a name or a path
             for op in args.ops.split(",")]
    sources = build_all(specs, [variant_a] + variants_b)
    libraries = compile_all(sources)
    print(f"compiled {len(libraries)} kernels", flush=True)
    failed = []
    if args.verify:
        verdicts = verify_all(sources, args.out)
        failed = [key for key, v in verdicts.items() if not v.get("passed")]
        for key in failed:  # a wrong or hanging kernel is not timed
            op, name = key.split("/")
            libraries[(op, name)] = None
    if not variants_b:
        return 1 if failed else 0
    names = [b.name for b in variants_b]
    rows = []
    for spec in specs:
        shapes = list(spec.benchmark) + (EXTRA_SHAPES.get(spec.name, []) if args.extra_shapes else [])
        rows += ab_rows(spec, variant_a, variants_b, libraries, args.dtypes.split(","), shapes)
        write_atomic(args.out / "variant_ab.json", json.dumps({"a": args.a, "b": names, "rows": rows}, indent=1))
        write_atomic(args.out / "variant_ab.md", table(rows, args.a, names) + "\n")
        print(f"[{spec.name}] done", flush=True)
    print(table(rows, args.a, names))
    if failed:
        print(f"verification FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
