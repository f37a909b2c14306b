"""The cases verifier version 12 makes on a GPU, per spec and direction, from its own case builders
(specgen.verify.strategies, .threaded, .chained, .engine), as (phase, dims, dtype, stream kind):
everything but the Hypothesis draws, which `hypothesis_sample` samples from the verifier's own strategy.
Used by triggers.py to count, for each cheat, the cases that meet its trigger.

Spoiler: reading this file alone spoils nothing; triggers.py does.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SUITE.parents[1]))

from specgen.spec import load_spec  # noqa: E402
from specgen.verify import chained, engine, strategies, threaded  # noqa: E402
from specgen.verify.strategies import (DEFAULT_BUDGET_ELEMENTS, EVERY_CLASS, boundary_cases, classes_at_scale,  # noqa: E402
                                       fewer_rows_case, fresh_case, full_size_cases, large_case, make_case,
                                       more_rows_case, past_int32_case, scalars_at_scale, smoke_case)


def spec_of(name: str):
    return load_spec(SUITE / "specs" / f"{name}.yaml")


def launch_bound(spec, seed=0):
    cases = [smoke_case(spec, seed + 11)]
    if spec.benchmark:
        smallest = min(spec.benchmark, key=lambda shape: math.prod(int(v) for v in shape.values()))
        dims = {s: int(smallest[s]) for s in spec.signature.symbols()}
        dims = strategies.fit_budget(spec.signature, dims, spec.dims, DEFAULT_BUDGET_ELEMENTS)
        case = make_case(dims, spec.dtypes[-1], seed=seed + 12)
        if case.dim_map != cases[0].dim_map:
            cases.append(case)
    return cases


def gpu_cases(spec, direction: str = "forward", seed: int = 0):
    """Every deterministic case of one direction on a GPU: (phase, dims dict, dtype, stream, captured)."""
    out = []

    def add(phase, case, stream="pool", captured=False):
        out.append((phase, case.dim_map, case.dtype, stream, captured, case.distribution))

    smoke = smoke_case(spec, seed)
    add("first calls", smoke)
    add("smoke", smoke, engine.SMOKE_STREAM)
    add("indices / starved", smoke, engine.SMOKE_STREAM)
    add("capture", smoke, "pool", True)
    for k in (1, 2, 3):
        add("capture replays", fresh_case(smoke, smoke.seed + k), "pool", True)
    for i, case in enumerate(boundary_cases(spec, DEFAULT_BUDGET_ELEMENTS, seed, EVERY_CLASS)):
        add("boundary/sweep", case, engine.boundary_stream(i))
    if direction == "backward":
        for case in chained.chained_cases(spec, DEFAULT_BUDGET_ELEMENTS, seed + 6000):
            add("chained", case)
    big = large_case(spec, DEFAULT_BUDGET_ELEMENTS, seed + 7)
    add("repeated calls", big, engine.LOOP_STREAM)
    if (fewer := fewer_rows_case(spec, big)) is not None:
        add("fewer rows", fewer, engine.LOOP_STREAM)
    if (more := more_rows_case(spec, big)) is not None:
        add("more rows", more, engine.LOOP_STREAM)
    lb = launch_bound(spec, seed)
    for case in [big, *lb]:
        add("model loop", case, engine.LOOP_STREAM)
        add("side by side / then-copy", case)
    for (a, _), (b, _) in threaded.thread_calls(big, lb, direction):
        add("threads", a)
        add("threads", b)
    for a, b in threaded.fresh_pairs(spec, seed, DEFAULT_BUDGET_ELEMENTS):
        add("threads, new shapes", a)
        add("threads, new shapes", b)
    add("endurance", smoke_case(spec, seed + 4), "pool", True)
    fs = full_size_cases(spec, seed + 500)
    extra = classes_at_scale(spec, fs[:len(spec.benchmark)], EVERY_CLASS, seed + 600) if fs else []
    if fs and spec.benchmark:
        extra += scalars_at_scale(spec, fs[0], EVERY_CLASS, seed + 650)
    for i, case in enumerate(fs + extra):
        add("full size", case, engine.FULL_SIZE_STREAMS[i % 3], captured=(i == 0))
    for shape, dtype in engine.timed_pairs(spec.benchmark, spec.dtypes):
        add("timed", make_case({s: int(shape[s]) for s in spec.signature.symbols()}, dtype))
    if (p := past_int32_case(spec, seed + 700)) is not None:
        add("past 2^31", p)
    return out


def elements(spec, dims) -> int:
    """Elements of the first input (the largest tensor of every spec here)."""
    return math.prod(spec.signature.inputs[0].type.shape(dims))


def hypothesis_sample(spec, count: int = 4000, seed: int = 0):
    """Draws of the verifier's Hypothesis strategy (the same function the engine gives @given)."""
    import random

    from hypothesis import strategies as st  # noqa: F401

    strat = strategies.case_strategy(spec, DEFAULT_BUDGET_ELEMENTS, EVERY_CLASS)
    random.seed(seed)
    draws = []
    for _ in range(count):
        draws.append(strat.example())
    return draws


if __name__ == "__main__":
    for name in sys.argv[1:] or ["softmax"]:
        spec = spec_of(name)
        for d in ("forward", "backward"):
            cases = gpu_cases(spec, d)
            print(name, d, len(cases), "cases; largest", max(elements(spec, c[1]) for c in cases))
