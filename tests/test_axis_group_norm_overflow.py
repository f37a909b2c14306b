"""GroupNorm's backward keeps its sums O(|dy * w|) in float32 (optimize.centred_cross_sums).

torch's decomposition of native_group_norm_backward takes c2 = (db * mean - ds) * rstd^3 / n with
ds = sum(dy * w * x) over the raw x. On the verifier's `huge` values (near 1e15), with FiLM's
gamma folded into dy, each term of ds is ~1e45: float32 overflowed and groupnorm_film's grad_x
was inf/NaN on the GPU where the float64 truth is about -4.3e6. The pass rewrites the product
into -sum(dy * w * (x - mean) * rstd) * rstd^2 / n. The CPU interpreter in float32 (the kernels'
accumulator) checks the arithmetic here; the GPU verifies.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specgen.agents.builtin.families.axis_emit import AxisEmitter
from specgen.agents.builtin.families.axis_reduce import lower_axis, run_axis_program
from specgen.agents.builtin.interp import run_program
from specgen.agents.builtin.ir import Node, Program, Store, const
from specgen.agents.builtin.optimize import _uncentred_difference, centred_cross_sums, cse
from specgen.inputs import make_inputs
from specgen.signature import Dim
from specgen.spec import load_spec

TESTS = Path(__file__).resolve().parent
GROUP_NORMS = [TESTS / "reduce_specs" / f"{op}.yaml" for op in ("groupnorm_film", "groupnorm_3d", "groupnorm_literal")] \
    + [TESTS.parent / "benchmarks" / "level1" / "specs" / f"{op}.yaml" for op in ("groupnorm4_ncl_affine",
                                                                                 "groupnorm_module")]


def _huge_case(spec, dims, seed):
    """(the kernel's inputs in float32 on `huge` values, the float64 autograd truth by input)."""
    sig = spec.signature
    args = make_inputs(sig, dims, "float32", seed=seed, distribution="huge")
    leaves = {k: v.double().requires_grad_() for k, v in args.items()}
    out = spec.reference_fn()(**leaves)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    truth = torch.autograd.grad(out, [leaves[p.name] for p in sig.inputs], grad_out)
    read = dict(args) | {"out": spec.reference_fn()(**args), "grad_out": grad_out.float()}
    return read, dict(zip((p.name for p in sig.inputs), truth))


def test_groupnorm_film_backward_is_finite_and_close_on_huge_values():
    """B=16 G=16 L=257, seed 107 (the GPU's failing case): before the rewrite 250832 elements of
    grad_x were inf/NaN; now every gradient is within 1e-6 of its largest magnitude (7.9e-8 for
    grad_x, 2.0e-7 for grad_weight) and 1e-4 relative."""
    spec = load_spec(TESTS / "reduce_specs" / "groupnorm_film.yaml")
    dims = {"B": 16, "G": 16, "L": 257}
    read, truth = _huge_case(spec, dims, seed=107)
    outs = {f"grad_{n}": torch.full(t.shape, float("nan"), dtype=torch.float32) for n, t in truth.items()}
    run_axis_program(lower_axis(spec)["backward"], read, {}, dims, outs, acc=torch.float32)
    for name, want in truth.items():
        got = outs[f"grad_{name}"].double()
        assert got.isfinite().all(), f"grad_{name}: {(~got.isfinite()).sum().item()} non-finite"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6 * want.abs().max().item(), msg=f"grad_{name}")


@pytest.mark.parametrize("path", GROUP_NORMS, ids=lambda p: p.stem)
def test_group_norm_backwards_sum_the_normalized_input(path):
    """Every GroupNorm backward of the suites: no uncentred difference sum(a * x) - sum(a) * mean
    is left, and one sum reads a * ((x - mean) * rstd) with the variance's own deviation node."""
    spec = load_spec(path)
    program = lower_axis(spec)["backward"]
    nodes = program.nodes()
    assert not any(n.level == "row" and _uncentred_difference(n) is not None for n in nodes)
    centred = [n for n in nodes if n.op == "rowreduce" and n.args[0].op == "mul"
               and any(f.op == "mul" and f.args[0].op == "sub" and f.args[1].op == "rsqrt" for f in n.args[0].args)]
    assert len(centred) == 1
    deviation = next(f for f in centred[0].args[0].args if f.op == "mul").args[0]
    assert any(n.op == "rowreduce" and n.args[0].op == "mul" and n.args[0].args[0] is deviation for n in nodes)
    # the sum reads rstd: a sweep after the variance's
    assert len(AxisEmitter(spec, program, "backward").plan()["phases"]) == 3


# ---------------------------------------------------------------- the pass on programs built by hand

def _load(field: str) -> Node:
    return Node("load", level="elem", name=field, attrs={"field": field, "kind": "elem", "row_div": []})


def _mul(a: Node, b: Node) -> Node:
    return Node("mul", (a, b), level=max(a, b, key=lambda n: ("const", "global", "row", "elem").index(n.level)).level)


def _sum(a: Node, kind: str = "sum") -> Node:
    return Node("rowreduce", (a,), level="row", attrs={"kind": kind})


def _program(difference, scale="rstd", mean_of="x") -> Program:
    """A row of x with its mean and rstd, g and w: out = difference(ds, db, mean) * scale * rstd."""
    width = Node("dim", level="global", dtype="int", attrs={"dim": Dim("D")})
    count = Node("cast", (width,), level="global")
    x, g, w = _load("x"), _load("g"), _load("w")
    mean = Node("div", (_sum(x), count), level="row")
    dev = Node("sub", (x, mean), level="elem")
    var = Node("div", (_sum(_mul(dev, dev)), count), level="row")
    rstd = Node("rsqrt", (Node("add", (var, const(1e-5)), level="row"),), level="row")
    ds = _sum(_mul(_mul(g, x), w))
    db = _sum(_mul(g, w))
    m = mean if mean_of == "x" else Node("div", (_sum(g), count), level="row")
    r = rstd if scale == "rstd" else _sum(x, "max")
    out = _mul(_mul(difference(ds, db, m), r), rstd)
    return cse(Program("op", "backward", [Dim("N")], width, 8, [Store("out", out, "row")]))


DIFFERENCES = {
    "torch's": lambda ds, db, m: Node("add", (Node("neg", (ds,), level="row"), _mul(_mul(db, const(1.0)), m)),
                                      level="row"),
    "ds - m * db": lambda ds, db, m: Node("sub", (ds, _mul(m, db)), level="row"),
}


def _run(program, values, acc):
    out = torch.zeros(values["x"].shape[0], dtype=acc)
    run_program(program, values, {}, {"N": values["x"].shape[0], "D": values["x"].shape[1]}, {"out": out}, acc=acc)
    return out


@pytest.mark.parametrize("form", sorted(DIFFERENCES))
def test_the_rewrite_is_exact_and_stays_finite(form):
    plain = _program(DIFFERENCES[form])
    centred = centred_cross_sums(plain)
    assert any(n.level == "row" and _uncentred_difference(n) is not None for n in plain.nodes())
    assert not any(n.level == "row" and _uncentred_difference(n) is not None for n in centred.nodes())
    # ds and db (read by nothing else here) give way to the one centred sum
    assert sum(n.op == "rowreduce" for n in centred.nodes()) == sum(n.op == "rowreduce" for n in plain.nodes()) - 1
    gen = torch.Generator().manual_seed(0)
    values = {k: torch.randn(6, 40, generator=gen, dtype=torch.float64) + 3 for k in "xgw"}
    torch.testing.assert_close(_run(centred, values, torch.float64), _run(plain, values, torch.float64),
                               rtol=1e-9, atol=1e-12)
    huge = {k: v * 1e15 for k, v in values.items()}  # terms of ds near 1e45: past float32's range
    assert not _run(plain, huge, torch.float32).isfinite().all()
    torch.testing.assert_close(_run(centred, huge, torch.float32).double(), _run(plain, huge, torch.float64),
                               rtol=1e-4, atol=0)


@pytest.mark.parametrize("case", [{"scale": "max"}, {"mean_of": "g"}])
def test_the_rewrite_needs_the_mean_and_rstd_of_the_summed_x(case):
    """A scale that is not x's reciprocal std, or a mean of another value: left as it is."""
    plain = _program(DIFFERENCES["torch's"], **case)
    assert centred_cross_sums(plain).stores[0].value is plain.stores[0].value
