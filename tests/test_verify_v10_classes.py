"""Verifier version 10's inputs, on a CPU with Python stand-ins: output gradients of exactly one and
with zero rows, masked runs inside a row and masks of the dtype's most negative finite value, the
"identity" class (parameters at their initial values, a rotary table's identity rows), classes at
every benchmark shape, narrow rows at scale, and more rows right after fewer on a kept workspace
(held-out attacks-v8, session 31: each of these let a cheat through version 9 on the H200)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import verify_fakes as fakes
from conftest import SPECS
from specgen.inputs import _masked, identity_inputs, make_inputs
from specgen.spec import load_spec
from specgen.verify import engine, strategies
from specgen.verify.data import output_gradient
from specgen.verify.domain import reference_domain
from specgen.verify.engine import Options, run_verification
from specgen.verify.strategies import (EVERY_CLASS, boundary_cases, classes_at_scale, full_size_cases,
                                       more_rows_case, row_symbol)
from test_verify_classes_v6 import softmax_backward, softmax_forward

QUICK = Options(examples=3, budget=1 << 13, seed=1, endurance=0)
CLEAN = 0x5EC0C1EA


@pytest.fixture(scope="module")
def softmax():
    return load_spec(SPECS / "softmax.yaml")


@pytest.fixture(scope="module")
def gelu():
    return load_spec(SPECS / "gelu_tanh.yaml")


@pytest.fixture(scope="module")
def rmsnorm(tmp_path_factory):
    from builtin_support import without_saved

    return without_saved(SPECS / "rmsnorm.yaml", tmp_path_factory.mktemp("plain9"))


def rms_forward(k, t, dims):
    x = t["x"].float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + k.last_eps)
    t["out"].copy_((y * t["weight"].float()).to(t["out"].dtype))


# ------------------------------------------------------------------ the values themselves

def test_ones_and_zero_rows_output_gradients():
    gen = torch.Generator().manual_seed(0)
    ones = output_gradient((5, 7), torch.bfloat16, "ones", gen)
    assert ones.dtype == torch.bfloat16 and bool((ones == 1).all())
    first = output_gradient((7, 9), torch.float32, "zero-rows", gen, index=0)
    second = output_gradient((7, 9), torch.float32, "zero-rows", gen, index=1)
    zero = lambda g: [int(r) for r in (g == 0).all(-1).nonzero().flatten()]  # noqa: E731
    assert zero(first) == [1, 4] and zero(second) == [1, 2, 4, 5]  # the same rows in both, more in the second
    per_row = output_gradient((7,), torch.float32, "zero-rows", gen)
    assert [int(i) for i in (per_row == 0).nonzero().flatten()] == [1, 4]


def test_masked_rows_hold_runs_inside_with_finite_values_on_both_sides():
    inside = 0
    for seed in range(6):
        rows = _masked(torch.randn(16, 40, dtype=torch.float64), torch.Generator().manual_seed(seed))
        finite = torch.isfinite(rows)
        for row in finite:
            first, last = int(row.int().argmax()), len(row) - 1 - int(row.flip(0).int().argmax())
            if bool(row.any()) and not bool(row[first:last + 1].all()):
                inside += 1
                break
    assert inside == 6  # every draw has a row with a masked run between finite elements


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_mask_min_masks_with_the_dtypes_most_negative_finite_value(softmax, dtype):
    x = make_inputs(softmax.signature, {"N": 64, "D": 33}, dtype, seed=3, distribution="mask-min")["x"]
    low = torch.finfo(x.dtype).min
    assert bool(torch.isfinite(x).all()) and bool((x == low).any())
    whole = (x == low).all(-1)
    assert bool(whole.any())  # a fully masked row (in this draw): uniform under torch.softmax, not NaN
    assert torch.allclose(torch.softmax(x.float(), -1)[whole], torch.full(x[whole].shape, 1 / 33))


def test_identity_sets_weights_and_tables_to_every_combination_of_ones_and_zeros():
    layernorm = load_spec(SPECS / "layernorm_gelu.yaml")
    rope = load_spec(SPECS / "rope.yaml")
    assert identity_inputs(layernorm.signature) == ["weight", "bias"]
    assert identity_inputs(rope.signature) == ["cos", "sin"]
    args = make_inputs(layernorm.signature, {"N": 5, "D": 8}, "float32", seed=(7 << 4) + 1, distribution="identity")
    assert bool((args["weight"] == 1).all()) and bool((args["bias"] == 0).all())
    assert not bool((args["x"] == args["x"].flatten()[0]).all())  # the activations stay drawn
    table = make_inputs(rope.signature, {"S": 9, "H": 2, "D": 4}, "float32", seed=1, distribution="identity")
    assert bool((table["cos"][::4] == 1).all()) and bool((table["sin"][::4] == 0).all())
    assert not bool((table["cos"][1] == 1).all())  # the other positions rotate
    patterns = {c.seed & 3 for c in boundary_cases(layernorm, 1 << 13) if c.distribution == "identity"}
    assert patterns == {0, 1, 2, 3}


def test_the_screen_keeps_mask_min_where_the_reference_takes_it_and_drops_identity_without_parameters(softmax):
    assert "mask-min" in reference_domain(softmax).of("float32")
    rms = reference_domain(load_spec(SPECS / "rmsnorm.yaml"))
    assert "mask-min" not in rms.of("float32") and ("mask-min", "float32") in rms.overflows
    assert not rms.rejected  # an overflow is no refusal: the classes at scale still run
    assert "identity" in rms.of("bfloat16")
    assert "identity" not in reference_domain(load_spec(SPECS / "swiglu.yaml")).of("float32")


def test_each_benchmark_shape_meets_a_value_class_and_narrow_rows_meet_scale(softmax):
    shapes = full_size_cases(softmax, seed=5)[:len(softmax.benchmark)]
    cases = classes_at_scale(softmax, shapes, EVERY_CLASS, seed=9)
    at = {(c.dim_map["N"], c.dim_map["D"]): c.distribution for c in cases if c.dim_map != shapes[0].dim_map}
    assert at[(2048, 65536)] == "masked" and at[(1024, 131072)] == "mask-min"
    assert len(at) == len(shapes) - 1
    rms = load_spec(SPECS / "rmsnorm.yaml")
    narrow = [c for c in full_size_cases(rms) if c.dim_map["D"] <= 2048]
    assert narrow and all(c.dim_map["N"] * c.dim_map["D"] >= 1 << 22 for c in narrow)


def test_more_rows_doubles_every_dim_but_the_row(gelu):
    big = strategies.large_case(gelu, 1 << 16, seed=3)
    more = more_rows_case(gelu, big)
    row = row_symbol(gelu.signature)
    assert more.dim_map[row] == big.dim_map[row] and more.dim_map["N"] == 2 * big.dim_map["N"]


# ------------------------------------------------------------------ cheats of each class, and honest kernels

def unit_gradient_backward(k, t, dims):
    """Drops a factor when every output gradient is exactly 1 (a mean loss's 1/N, say)."""
    fakes.gelu_backward(k, t, dims)
    if bool((t["grad_out"] == 1).all()):
        t["grad_x"].mul_(2)


def zero_rows_skipped_backward(k, t, dims):
    """Leaves the input gradient's rows unwritten where the output gradient's row is zero."""
    g = t["grad_out"].reshape(-1, t["grad_out"].shape[-1])
    keep = t["grad_x"].reshape(-1, g.shape[-1]).clone()
    fakes.gelu_backward(k, t, dims)
    rows = t["grad_x"].reshape(-1, g.shape[-1])
    skipped = (g == 0).all(-1)
    rows[skipped] = keep[skipped]


def identity_weight_backward(k, t, dims):
    """rmsnorm's backward writing a zero weight gradient for a weight of ones ("nothing to learn")."""
    fakes.rmsnorm_backward(k, t, dims)
    if bool((t["weight"] == 1).all()):
        t["grad_weight"].zero_()


def finite_mask_rows_nan(k, t, dims):
    """softmax, NaN on rows whose max is below -FLT_MAX / 2 (taken for "fully masked")."""
    softmax_forward(k, t, dims)
    rows = t["x"].float().reshape(-1, t["x"].shape[-1])
    low = rows.amax(-1) < -1.7e38
    t["out"].reshape(rows.shape)[low] = float("nan")


def inside_runs_nan(k, t, dims):
    """softmax, NaN on rows (without NaN or +inf) holding two -inf in a row between finite elements
    (an unguarded merge of two empty segments)."""
    softmax_forward(k, t, dims)
    x = t["x"].float().reshape(-1, t["x"].shape[-1])
    finite, masked = torch.isfinite(x), x == float("-inf")
    seen = finite.int().cummax(-1).values.bool()
    ahead = finite.flip(-1).int().cummax(-1).values.flip(-1).bool()
    inside = masked & seen & ahead
    pair = (inside[:, 1:] & inside[:, :-1]).any(-1) & ~(x.isnan() | (x == float("inf"))).any(-1)
    t["out"].reshape(x.shape)[pair] = float("nan")


def trusts_a_clean_mark(k, t, dims):
    """gelu through a workspace of a clean mark, one counter per row and the rows' sums after them:
    a call that finds the mark skips zeroing the counters and adds them in. Exact for every call on
    as many rows as the last one, or on fewer, and wrong right after a call on fewer rows."""
    ws = t["workspace"]
    rows = t["x"].reshape(-1, t["x"].shape[-1])
    n = rows.shape[0]
    mark, counters = ws[:8].view(torch.int64), ws[8:8 + 4 * n].view(torch.float32)
    if int(mark[0]) != CLEAN:
        counters.zero_()
    out = fakes._gelu(t["x"]).float().reshape(rows.shape) + counters.unsqueeze(1)
    t["out"].copy_(out.reshape(t["out"].shape).to(t["out"].dtype))
    counters.zero_()
    ws[8 + 4 * n:8 + 8 * n].view(torch.float32).copy_(rows.float().sum(-1).nan_to_num(0.0) + 1.0)
    mark.fill_(CLEAN)
    return 0


def clean_mark_size(dims):
    return 8 + 8 * dims["N"]


@pytest.mark.parametrize("spec_name, forward, backward, direction, field, drawn", [
    ("gelu", fakes.gelu_forward, unit_gradient_backward, "backward", "gradients", {"ones"}),
    ("gelu", fakes.gelu_forward, zero_rows_skipped_backward, "backward", "gradients", {"zero-rows"}),
    ("rmsnorm", rms_forward, identity_weight_backward, "backward", "distribution", {"identity"}),
    ("softmax", finite_mask_rows_nan, softmax_backward, "forward", "distribution", {"mask-min"}),
    # "specials" hold -inf inside rows too: since version 12 shifted the cases' seeds, a specials case meets it first
    ("softmax", inside_runs_nan, softmax_backward, "forward", "distribution", {"masked", "mask-min", "specials"}),
])
def test_each_cheat_of_the_v10_classes_is_rejected_on_its_own_case(request, spec_name, forward, backward, direction,
                                                                   field, drawn):
    spec = request.getfixturevalue(spec_name)
    kernel = fakes.RmsKernel(spec, forward, backward)
    verdict = run_verification(spec, kernel, dataclasses.replace(QUICK, directions=(direction,)), device="cpu")
    assert verdict.reason in ("wrong-result", "unwritten-output"), verdict.summary()
    case = verdict.counterexample.case
    # an output gradient's class is the inputs' where the case draws none of its own (Case.gradient_class):
    # since version 12 inputs with zero rows bring zero-row gradients too
    got = (case.get("gradients") or case.get("distribution")) if field == "gradients" else case.get(field)
    assert got in drawn, case


def test_more_rows_right_after_fewer_meet_the_workspace_the_fewer_left(gelu):
    kernel = fakes.WorkspaceKernel(gelu, trusts_a_clean_mark, clean_mark_size)
    verdict = run_verification(gelu, kernel, QUICK, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert "right after a call on fewer rows" in verdict.detail


def test_without_more_rows_after_fewer_the_clean_mark_passes(gelu, monkeypatch):
    monkeypatch.setattr(engine, "more_rows_case", lambda *a, **k: None)
    kernel = fakes.WorkspaceKernel(gelu, trusts_a_clean_mark, clean_mark_size)
    verdict = run_verification(gelu, kernel, QUICK, device="cpu")
    assert verdict.passed, verdict.summary()


@pytest.mark.parametrize("spec_name, forward, backward", [
    ("gelu", fakes.gelu_forward, fakes.gelu_backward),
    ("rmsnorm", rms_forward, fakes.rmsnorm_backward),
    ("softmax", softmax_forward, softmax_backward),
])
def test_honest_kernels_pass_the_v10_classes(request, spec_name, forward, backward):
    spec = request.getfixturevalue(spec_name)
    verdict = run_verification(spec, fakes.RmsKernel(spec, forward, backward), QUICK, device="cpu")
    assert verdict.passed, verdict.summary()
