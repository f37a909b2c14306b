#!/usr/bin/env python3
"""How often version 13's own case builders meet the size- or value-keyed triggers of attacks-v11
(counted from specgen.verify.strategies, nothing run):

- cross_entropy_a: rows on its split path (N <= 64, C >= 8192) whose target falls in the row's tail
  (after the last whole 16-byte vector, from the row's alignment: the case's offset view and the row
  index), with targets uniform in [0, C) as the verifier draws them: the expected number of such rows
  over the boundary walk and sweep, the full-size cases, the launch-bound and decode-capture cases,
  and a sample of its Hypothesis strategy (scaled to the 30 draws a direction makes).
- add_rmsnorm_a: the largest element distance from x to residual in any of its layouts (x then
  residual, each region 256-aligned with 512 guard bytes around it), against 2^31.
- softmax_a: the shape of its one call with no memory left to allocate, against the split threshold.

    PYTHONPATH=. python3 heldout/attacks-v11/cpu_checks/exposure.py [--hypothesis 3000]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
REPO = SUITE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def tail_rows(case, vec: int) -> float:
    """Expected rows of `case` whose uniform target lies in the row's tail."""
    from specgen.verify import strategies as S

    d = case.dim_map
    N, C = d["N"], d["C"]
    off = S.input_offset(case.offset, 0)  # the logits view's element offset (arena regions are 256-aligned)
    total = 0
    for r in range(N):
        mis = (r * C + off) % vec
        head = (vec - mis) % vec
        total += (C - head) % vec
    return total / C


def cross_entropy(hypothesis: int) -> None:
    from hypothesis import HealthCheck, given, settings

    from specgen.spec import load_spec
    from specgen.verify import strategies as S

    spec = load_spec(SUITE / "specs" / "cross_entropy.yaml")

    def on_path(c):
        return c.dim_map["N"] <= 64 and c.dim_map["C"] >= 8192

    def vec(c):
        return 4 if c.dtype == "float32" else 8

    groups = {
        "boundary+sweep": S.boundary_cases(spec, S.DEFAULT_BUDGET_ELEMENTS, 0),
        "full size": S.full_size_cases(spec, 500),
        "smoke": [S.smoke_case(spec, 0)],
        "large (repeated calls, threads, first call per dtype)": [S.large_case(spec, S.DEFAULT_BUDGET_ELEMENTS, 7)],
    }
    smallest = min(spec.benchmark, key=lambda s: math.prod(int(v) for v in s.values()))
    launch = S.make_case(S.fit_budget(spec.signature, {k: int(v) for k, v in smallest.items()}, spec.dims,
                                      S.DEFAULT_BUDGET_ELEMENTS), spec.dtypes[-1])
    one = S.one_row_case(spec, launch)
    groups["launch-bound + decode captures"] = [launch] + ([one] if one else [])
    groups["timed (benchmark shapes)"] = [S.make_case({k: int(v) for k, v in b.items()}, spec.dtypes[0])
                                          for b in spec.benchmark]
    print("cross_entropy_a: rows whose target lies in the row's tail on the split path (N <= 64, C >= 8192)")
    total = 0.0
    for name, cases in groups.items():
        hit = [c for c in cases if on_path(c)]
        expected = sum(tail_rows(c, vec(c)) for c in hit)
        total += expected
        print(f"  {name:<55} {len(cases):5} cases, {len(hit):4} on the path, expected rows {expected:.4f}")
    drawn = []

    @settings(max_examples=hypothesis, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=True)
    @given(S.case_strategy(spec, S.DEFAULT_BUDGET_ELEMENTS))
    def collect(case):
        drawn.append(case)

    collect()
    hit = [c for c in drawn if on_path(c)]
    per_draw = sum(tail_rows(c, vec(c)) for c in hit) / max(len(drawn), 1)
    print(f"  {'Hypothesis (' + str(len(drawn)) + ' draws)':<55} {len(hit):4} on the path, expected rows per 30 "
          f"draws {30 * per_draw:.4f}")
    total += 30 * per_draw
    print(f"  expected rows meeting the bug in one verification (forward): {total:.3f}")
    # the user's situation: GPT-2's vocabulary, the EOS token 50256 = C - 1, rows of a 16-token text
    C = 50257
    for name, v in (("float32", 4), ("16-bit", 8)):
        rows = sum(1 for r in range(16) if (C - ((v - (r * C) % v) % v)) % v > 0)
        print(f"  GPT-2 (C = 50257, EOS = 50256), {name}: EOS in the tail for {rows} of 16 rows")


def add_rmsnorm() -> None:
    from specgen.spec import load_spec
    from specgen.verify import strategies as S

    spec = load_spec(SUITE / "specs" / "add_rmsnorm.yaml")
    cases = S.full_size_cases(spec, 500) + S.boundary_cases(spec, S.DEFAULT_BUDGET_ELEMENTS, 0)
    past = S.past_int32_case(spec)
    worst = max(cases, key=lambda c: c.dim_map["N"] * c.dim_map["D"])
    n = worst.dim_map["N"] * worst.dim_map["D"]
    # x's region: 512 guard bytes, x, 512 guard bytes; residual's starts at the next 256-byte boundary + 512
    distance = n + (512 + 256 + 512 + 4 * 4) // 2
    print("add_rmsnorm_a: largest x -> residual distance in the verifier's layouts")
    print(f"  largest case {worst.describe()}: {n} elements per input, distance <= {distance} elements "
          f"(2^31 = {1 << 31}); case past 2^31 elements: {past}")


def softmax() -> None:
    from specgen.spec import load_spec
    from specgen.verify import strategies as S

    spec = load_spec(SUITE / "specs" / "softmax.yaml")
    smoke = S.smoke_case(spec, 0)
    print(f"softmax_a: the call with no memory left runs at the smoke shape {smoke.describe()}; the split path "
          f"(the only one that allocates) starts above D = 32768")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hypothesis", type=int, default=3000)
    args = parser.parse_args()
    cross_entropy(args.hypothesis)
    add_rmsnorm()
    softmax()
    return 0


if __name__ == "__main__":
    sys.exit(main())
