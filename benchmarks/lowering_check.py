"""The built-in generator's lowering of a suite, checked on the CPU: which specs lower (their kernel
source builds) and whether each lowered program, run by the CPU interpreter in float64, gives the
reference's outputs and autograd's gradients at small sizes (two random ones and every size at its
lower bound). No GPU: a held-out suite's lowering measured before a GPU is reached.

    python benchmarks/lowering_check.py --specs heldout/problems-v8 --json OUT.json [--summary-only]

--summary-only prints the counts alone (per family and in all), not the problems' names: a held-out
suite's names stay unread. The JSON has every row (name, family, state, each direction's check and
its message). Exit 0 whatever the counts (a measurement); 2 when no spec is found.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from level1_bench import find_specs, spec_family  # noqa: E402

SAMPLES = 2  # random small sizes a direction, besides the smallest
# The interpreter runs in float64 but keeps the IR's float32 constants (hardsigmoid's backward
# multiplies by 1/6 rounded to float32: 3e-8 relative); a lowering bug is off by far more
TOL = 1e-6
SCALAR_POINTS = (0.37, 0.81)  # where in its range a float scalar is, past the first size (its default there)


def check_directions(spec, programs: dict, seed: int) -> dict[str, str]:
    """{direction: "match" | "mismatch: ..." | "not run: ..."} at SAMPLES random small sizes and the smallest."""
    from specgen.agents.builtin.cpu_check import check_backward, check_forward
    from specgen.checking import MAX_CHECK_ELEMENTS, _largest_tensor, small_dims, smallest_dims

    rng = random.Random(seed)
    sizes = [small_dims(spec, rng) for _ in range(SAMPLES)]
    if _largest_tensor(spec.signature, smallest_dims(spec))[0] <= MAX_CHECK_ELEMENTS:
        sizes.append(smallest_dims(spec))
    checks = {"forward": check_forward, "backward": check_backward}
    result = {}
    for direction in programs:
        state = "match"
        for k, dims in enumerate(sizes):
            try:
                # the first size at the scalars' defaults, the others at points of their ranges
                checks[direction](spec, dims, seed=seed + k, tol=TOL, programs=programs,
                                  scalar_point=None if k == 0 else SCALAR_POINTS[k % len(SCALAR_POINTS)])
            except AssertionError as error:
                state = f"mismatch at {dims}: {str(error).strip().splitlines()[0][:300]}"
                break
            except Exception as error:  # noqa: BLE001 - the interpreter or the reference at these sizes
                state = f"not run at {dims}: {type(error).__name__}: {str(error)[:300]}"
                break
        result[direction] = state
    return result


def check_one(path: Path, seed: int) -> dict:
    from specgen.agents.base import AgentRefused
    from specgen.agents.builtin import build_source
    from specgen.agents.builtin.generator import lower_spec
    from specgen.spec import load_spec

    row = {"name": path.stem, "family": spec_family(path)}
    started = time.perf_counter()
    try:
        spec = load_spec(path)
        build_source(spec)
        programs = lower_spec(spec)
    except AgentRefused as error:
        row.update(state="refused", message=str(error)[:1000])
    except Exception as error:  # noqa: BLE001 - reported, the suite goes on
        row.update(state="error", message=f"{type(error).__name__}: {str(error)[:1000]}")
    else:
        from specgen.agents.builtin.families.staged import StagedProgram

        row["state"] = "lowered"
        # stages per direction where the staged family took it (families/staged.py)
        row["stages"] = {d: len(p.stages) for d, p in programs.items() if isinstance(p, StagedProgram)}
        row["checks"] = check_directions(spec, programs, seed)
        row["matched"] = all(v == "match" for v in row["checks"].values())
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def summary(rows: list[dict]) -> dict:
    lowered = [r for r in rows if r["state"] == "lowered"]
    checks = Counter(v.split(" ")[0] for r in lowered for v in r["checks"].values())
    return {"specs": len(rows), "lowered": len(lowered), "refused": sum(r["state"] == "refused" for r in rows),
            "errors": sum(r["state"] == "error" for r in rows),
            "lowered_and_matched": sum(r["matched"] for r in lowered),
            "staged": sum(bool(r.get("stages")) for r in lowered),
            "staged_and_matched": sum(bool(r.get("stages")) and r["matched"] for r in lowered),
            "directions": {"match": checks["match"], "mismatch": checks["mismatch"], "not run": checks["not"]},
            "by_family": {f: {"specs": sum(r["family"] == f for r in rows),
                              "lowered": sum(r["family"] == f for r in lowered),
                              "matched": sum(r["family"] == f and r["matched"] for r in lowered)}
                          for f in sorted({r["family"] for r in rows})}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", action="append", required=True, metavar="DIR", help="folder of specs (repeatable)")
    parser.add_argument("--json", type=Path, default=None, help="write every row and the summary here")
    parser.add_argument("--summary-only", action="store_true", help="print the counts only, no problem names")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = find_specs([Path(f) for f in args.specs])
    if not paths:
        print(f"lowering_check: no .yaml specs in {', '.join(args.specs)}", file=sys.stderr)
        return 2
    rows = []
    for path in paths:
        rows.append(check_one(path, args.seed))
        if not args.summary_only:
            r = rows[-1]
            checks = ", ".join(f"{d} {v}" for d, v in r.get("checks", {}).items())
            print(f"{r['name']:44s} {r['family']:14s} {r['state']:8s} {checks or r.get('message', '')[:120]}",
                  flush=True)
    total = summary(rows)
    if args.json:
        from specgen.fsutil import write_atomic

        write_atomic(args.json, json.dumps({"summary": total, "rows": rows}, indent=1))
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"lowering on the CPU: {', '.join(args.specs)}")
    for col in ("family", "specs", "lowered", "lowered and matched (CPU interpreter)"):
        table.add_column(col)
    for family, counts in total["by_family"].items():
        table.add_row(family, str(counts["specs"]), str(counts["lowered"]), str(counts["matched"]))
    table.add_row("all", str(total["specs"]), str(total["lowered"]), str(total["lowered_and_matched"]))
    Console().print(table)
    d = total["directions"]
    print(f"{total['lowered']} of {total['specs']} lowered ({total['refused']} refused, {total['errors']} errors); "
          f"{total['lowered_and_matched']} of {total['lowered']} lowered specs match in every direction "
          f"(directions: {d['match']} match, {d['mismatch']} mismatch, {d['not run']} not run); "
          f"{total['staged']} lowered in stages, {total['staged_and_matched']} of them matching")
    return 0


if __name__ == "__main__":
    sys.exit(main())
