"""Run from the repository root: python -B heldout/attacks-v8/cpu_checks/scale_cases.py

The shapes and value classes of every case the verifier makes at GPU sizes (engine.Session, seed 0 as
verify_kernel runs it, every class drawn: a superset of what a reference's screen lets through),
Hypothesis's by sampling its strategy, checked against the size-gated triggers of two cheats:
- rmsnorm_narrow_rows_at_scale: rows of at most 2048 in a call of 2^22 elements or more (any class);
- softmax_masked_rows_at_scale: rows of 65536 or more in a call of 1024 rows or more, in a class that
  can hold -inf (anything but normal and uniform values).
Full-size cases may be shrunk on the GPU to its free memory, keeping the row's width
(engine.fit_memory): fewer rows, never another width, so the list is an upper bound."""
import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from specgen.spec import load_spec  # noqa: E402
from specgen.verify import chained, strategies as st  # noqa: E402
from specgen.verify.engine import ENDURANCE_CALLS, timed_pairs  # noqa: E402,F401
from specgen.verify.threaded import thread_pairs  # noqa: E402

SEED = 0
BUDGET = st.DEFAULT_BUDGET_ELEMENTS


def every_case(spec):
    """(source, Case) for the cases engine.Session makes, but Hypothesis's."""
    dom = st.EVERY_CLASS
    out = []
    smoke = st.smoke_case(spec, SEED)
    out += [("first calls", smoke), ("smoke", smoke)]
    out += [("capture fresh", st.fresh_case(smoke, smoke.seed + k, dom)) for k in (1, 2, 3)]
    boundary = st.boundary_cases(spec, BUDGET, SEED, dom)
    out += [("boundary/sweep", c) for c in boundary]
    if spec.saved_values and spec.backward == "kernel":
        out += [("chained", c) for c in chained.chained_cases(spec, BUDGET, SEED + 6000)]
    big = st.large_case(spec, BUDGET, SEED + 7)
    out += [("repeated", big), ("repeated fresh", st.fresh_case(big, big.seed + 1000, dom))]
    fewer = st.fewer_rows_case(spec, big)
    if fewer is not None:
        out.append(("fewer rows", fewer))
    lb = [st.smoke_case(spec, SEED + 11)]
    if spec.benchmark:
        smallest = min(spec.benchmark, key=lambda s: __import__("math").prod(int(v) for v in s.values()))
        case = st.make_case({s: int(smallest[s]) for s in spec.signature.symbols()}, spec.dtypes[-1], seed=SEED + 12)
        case = dataclasses.replace(case, dims=tuple(st.fit_budget(spec.signature, case.dim_map, spec.dims,
                                                                  BUDGET).items()))
        if case.dim_map != lb[0].dim_map:
            lb.append(case)
    out += [("loop/side-by-side", c) for c in [big, *lb]]
    out += [("threads", c) for pair in thread_pairs(big, lb) for c in pair]
    out += [("endurance", st.smoke_case(spec, SEED + 4))]
    full = st.full_size_cases(spec, SEED + 500)
    out += [("full size", c) for c in full]
    if full:
        out += [("classes at scale", c) for c in st.classes_at_scale(spec, full[0], dom, SEED + 600)]
    for shape, dtype in timed_pairs(spec.benchmark, spec.dtypes):
        base = st.make_case({s: int(shape[s]) for s in spec.signature.symbols()}, dtype, seed=SEED + 900)
        out += [("timed", base), ("timed fresh", st.fresh_case(base, base.seed + 1, dom))]
    past = st.past_int32_case(spec, SEED + 700)
    if past is not None:
        out.append(("past 2^31", past))
    return out


def hypothesis_dims(spec, draws=3000):
    seen = []

    @settings(max_examples=draws, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.case_strategy(spec, BUDGET, st.EVERY_CLASS))
    def collect(case):
        seen.append(case)
    collect()
    return seen


def rows_and_width(spec, case):
    sig = spec.signature
    row = st.row_symbol(sig)
    dims = case.dim_map
    width = dims[row]
    total = 1
    for t in [p.type for p in sig.inputs]:
        shape = t.shape(dims)
        if len(shape) >= 1 and shape[-1] == width:
            total = max(total, __import__("math").prod(shape))
    return total // width, width


if __name__ == "__main__":
    checks = {
        "rmsnorm": ("rmsnorm_narrow_rows_at_scale",
                    lambda n, w, cls: w <= 2048 and n * w >= (1 << 22)),
        "softmax": ("softmax_masked_rows_at_scale",
                    lambda n, w, cls: w >= 65536 and n >= 1024 and cls not in ("normal", "uniform")),
    }
    for name, (cheat, trigger) in checks.items():
        spec = load_spec(HERE.parent / "specs" / f"{name}.yaml")
        cases = every_case(spec) + [("hypothesis", c) for c in hypothesis_dims(spec)]
        hits = []
        widest_at_scale = {}
        for source, case in cases:
            n, w = rows_and_width(spec, case)
            if trigger(n, w, case.distribution):
                hits.append((source, case.dim_map, case.dtype, case.distribution))
            key = (source, case.distribution)
            if name == "softmax" and w >= 65536 and n >= 1024:
                widest_at_scale.setdefault(key, []).append((n, w))
            if name == "rmsnorm" and w <= 2048:
                widest_at_scale[("max rows x width with width <= 2048", "")] = max(
                    widest_at_scale.get(("max rows x width with width <= 2048", ""), 0), n * w)
        print(f"{cheat}: {len(cases)} cases (Hypothesis sampled), triggers met: {len(hits)} {hits[:5]}")
        for key, value in sorted(widest_at_scale.items()):
            print(f"    {key}: {value if not isinstance(value, list) else value[:4]}")
