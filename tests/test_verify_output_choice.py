"""One output's gradient zero while another's is not (verifier version 16: data.output_gradient's
"first-only" and "first-zero" classes, for specs of two or more floating outputs). A model that
discards one output of a fused op (`hidden, _ = norm(hidden, residual)`) hands autograd's zeros for
it; held-out attacks-v11's add + RMSNorm took a 4-row tile whose residual_out gradient was all zero
as "residual_out unused" and wrote grad_residual = 0, though residual reaches the loss through `out`
too. Every earlier class had a non-zero residual_out gradient in every tile, or a zero `out`
gradient beside it. The CPU stand-ins below run through the verifier's own engine."""
from __future__ import annotations

import pytest
import torch

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify.data import output_gradient, reference_gradients
from specgen.verify.engine import Options, run_verification
from specgen.verify.strategies import (DEFAULT_BUDGET_ELEMENTS, EVERY_CLASS, OUTPUT_CHOICE_CLASSES, boundary_cases,
                                      classes_at_scale, full_size_cases, gradient_classes)

SMALL = Options(examples=4, budget=1 << 13, seed=1, endurance=0, directions=("backward",))
TILE = 4  # rows per backward block in the stand-in's fast path


@pytest.fixture(scope="module")
def add_rmsnorm():
    from conftest import SPECS

    return load_spec(SPECS / "add_rmsnorm.yaml")


class WithScalars(fakes.PyKernel):
    """A stand-in that reads the call's scalars (eps is drawn in some cases)."""

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.scalars = scalars
        return super().call(direction, tensors, scalars, dims, stream)


def _autograd(k, t):
    """The reference's own autograd in float64 (an honest kernel's gradients, up to rounding)."""
    values = {name: t[name].double() for name in ("x", "residual", "weight")}
    values.update(k.scalars)
    return reference_gradients(k.spec, values, ["x", "residual", "weight"],
                               lambda o, out: t[f"grad_{o.name}"].double())


def honest_backward(k, t, dims):
    gx, gr, gw = _autograd(k, t)
    for name, g in (("grad_x", gx), ("grad_residual", gr), ("grad_weight", gw)):
        t[name].copy_(g.to(t[name].dtype))


def unused_residual_fast_path(k, t, dims):
    """Honest, but a whole tile of rows whose residual_out gradient is zero while out's is not is
    taken as "residual_out unused": grad_residual written 0 there."""
    honest_backward(k, t, dims)
    g_res = t["grad_residual_out"].reshape(-1, t["grad_residual_out"].shape[-1])
    g_out = t["grad_out"].reshape(-1, t["grad_out"].shape[-1])
    grad_residual = t["grad_residual"].view(-1, t["grad_residual"].shape[-1])
    if g_res.shape[-1] < 16:  # (the attack's fast path from 64 columns; the CPU budget's aligned rows are 32)
        return
    for row in range(0, g_res.shape[0] - TILE + 1, TILE):
        tile = slice(row, row + TILE)
        if not g_res[tile].any() and g_out[tile].any():
            grad_residual[tile] = 0


def honest_forward(k, t, dims):
    s = (t["x"] + t["residual"]).double()
    rstd = torch.rsqrt(s.pow(2).mean(-1) + k.scalars["eps"])
    t["out"].copy_((s * rstd[..., None] * t["weight"].double()).to(t["out"].dtype))
    t["residual_out"].copy_(s.to(t["residual_out"].dtype))
    t["saved_rstd"].copy_(rstd.reshape(t["saved_rstd"].shape).float())


def test_the_classes_are_drawn_only_for_two_floating_outputs(add_rmsnorm):
    from conftest import SPECS

    assert set(OUTPUT_CHOICE_CLASSES) <= set(gradient_classes(add_rmsnorm))
    softmax = load_spec(SPECS / "softmax.yaml")
    assert not set(OUTPUT_CHOICE_CLASSES) & set(gradient_classes(softmax))
    drawn = {c.gradients for c in boundary_cases(add_rmsnorm, 1 << 13, 0)}
    assert set(OUTPUT_CHOICE_CLASSES) <= drawn
    # on a GPU's budget, at a shape with whole tiles of many rows and wide rows
    wide = [c for c in boundary_cases(add_rmsnorm, DEFAULT_BUDGET_ELEMENTS, 0) if c.gradients in OUTPUT_CHOICE_CLASSES]
    assert wide and all(c.dim_map["D"] >= 64 and c.dim_map["N"] >= 16 for c in wide)


def test_a_backward_meets_them_at_the_first_benchmark_shape_too(add_rmsnorm):
    shapes = full_size_cases(add_rmsnorm, 0)[:len(add_rmsnorm.benchmark)]
    backward = classes_at_scale(add_rmsnorm, shapes, EVERY_CLASS, 0, backward=True)
    chosen = [c for c in backward if c.gradients]
    assert [c.gradients for c in chosen] == list(OUTPUT_CHOICE_CLASSES)
    assert all(c.dim_map == shapes[0].dim_map for c in chosen)
    assert not any(c.gradients for c in classes_at_scale(add_rmsnorm, shapes, EVERY_CLASS, 0))


@pytest.mark.parametrize("cls", OUTPUT_CHOICE_CLASSES)
def test_one_output_gradient_is_exactly_zero_and_the_other_is_not(cls):
    gen = torch.Generator().manual_seed(0)
    first = output_gradient((8, 64), torch.float32, cls, gen, index=0)
    second = output_gradient((8, 64), torch.float32, cls, gen, index=1)
    zero, other = (second, first) if cls == "first-only" else (first, second)
    assert not zero.any() and other.count_nonzero() == other.numel()


def test_an_honest_backward_passes(add_rmsnorm):
    verdict = run_verification(add_rmsnorm, WithScalars(add_rmsnorm, honest_forward, honest_backward),
                               SMALL, device="cpu")
    assert verdict.passed, verdict.summary()


def test_a_zero_gradient_taken_as_an_unused_output_is_rejected(add_rmsnorm):
    verdict = run_verification(add_rmsnorm, WithScalars(add_rmsnorm, honest_forward, unused_residual_fast_path),
                               SMALL, device="cpu")
    assert not verdict.passed
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.counterexample.case["gradients"] in OUTPUT_CHOICE_CLASSES
    assert verdict.counterexample.output == "grad_residual"
