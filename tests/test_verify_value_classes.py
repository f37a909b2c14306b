"""The value classes and output gradients added after held-out attacks-v5 got past the verifier
on the H200 (session 26): FP8-grid values ("quantized"), a ReLU's outputs ("sparse"), loss-scaled
output gradients ("large" backward cases) and NaN / infinities among the output gradients
("specials" backward cases). Each cheat below is exact on every other input; the CPU stand-ins
are the same cheats as the held-out CUDA kernels' headers describe."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import verify_fakes as fakes
from specgen.inputs import make_inputs
from specgen.spec import load_spec
from specgen.verify.data import LOSS_SCALE, gradient_scale, output_gradient, prepare
from specgen.verify.engine import Options, run_verification
from specgen.verify.strategies import VALUE_CLASSES, make_case

SMALL = Options(examples=4, budget=1 << 13, seed=1)


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


@pytest.mark.parametrize("forward, backward, direction", [
    (fakes.gelu_forward, fakes.sanitizes_grad_backward, "backward"),
    (fakes.gelu_forward, fakes.half_product_backward, "backward"),
    (fakes.fp8_grid_sniff, None, "forward"),
    (fakes.zero_tile_skip, None, "forward"),
])
def test_each_cheat_of_the_new_classes_is_rejected(gelu, forward, backward, direction):
    verdict = run_verification(gelu, fakes.PyKernel(gelu, forward, backward), SMALL, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.counterexample.direction == direction


def test_the_new_values_look_like_what_they_stand_for(gelu):
    assert {"quantized", "sparse"} <= set(VALUE_CLASSES)
    x = make_inputs(gelu.signature, {"N": 64, "D": 256}, "bfloat16", seed=3, distribution="quantized")["x"]
    assert bool((x.float().to(torch.float8_e4m3fn).float() == x.float()).all())  # on FP8 E4M3's grid
    assert x.float().abs().max() > 1.0 and x.unique().numel() > 20
    x = make_inputs(gelu.signature, {"N": 64, "D": 256}, "float32", seed=3, distribution="sparse")["x"]
    zeros = float((x == 0).float().mean())
    assert 0.4 < zeros < 0.6 and bool((x >= 0).all())


def test_output_gradients_follow_the_case_class():
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    normal = output_gradient((4096,), torch.float32, "normal", gen())
    assert normal.abs().max() < 6
    # one scale for every output gradient of a case, capped by the narrowest dtype
    assert gradient_scale([torch.float32], "large") == LOSS_SCALE
    assert gradient_scale([torch.float32, torch.float16], "large") == pytest.approx(65504 / 16)
    assert gradient_scale([torch.float32], "normal") == 1.0
    scale = gradient_scale([torch.float16], "large")
    scaled = output_gradient((4096,), torch.float16, "large", gen(), scale)
    assert bool(torch.isfinite(scaled).all()) and scaled.float().abs().max() > 4096  # loss-scaled, still finite
    special = output_gradient((4096,), torch.bfloat16, "specials", gen())
    assert bool(special.isnan().any()) and bool((special == float("inf")).any()) and bool((special == -float("inf")).any())


def test_a_non_finite_truth_takes_any_non_finite_answer_only_where_the_gradients_hold_specials(gelu):
    from specgen.verify.checks import check_close
    from specgen.verify.verdict import Failure

    data = prepare(gelu, make_case({"N": 8, "D": 64}, "float32", seed=2, distribution="specials"), "backward",
                   "cpu")
    assert data.nonfinite_any
    truth = data.truth["grad_x"]
    swapped = torch.where(truth.isnan(), torch.full_like(truth, float("inf")), truth).float()  # NaN given as inf
    check_close(data, {"grad_x": swapped})
    sanitized = torch.nan_to_num(truth).float()  # a finite value where the truth is not: still wrong
    with pytest.raises(Failure):
        check_close(data, {"grad_x": sanitized})
    # torch's masks pick 0 where a kernel multiplying by the mask gives NaN: both hold the NaN
    masked = truth.float().clone()
    zero = int((truth.reshape(-1) == 0).nonzero()[0]) if bool((truth == 0).any()) else None
    if zero is None:
        masked.reshape(-1)[0] = 0.0
        data.truth["grad_x"].reshape(-1)[0] = 0.0
        zero = 0
    masked.reshape(-1)[zero] = float("nan")
    check_close(data, {"grad_x": masked})
    data = prepare(gelu, make_case({"N": 8, "D": 64}, "float32", seed=2, distribution="specials"), "forward", "cpu")
    assert not data.nonfinite_any


def test_loss_scaled_gradients_scale_the_absolute_tolerance_too():
    """A backward is linear in its output gradients. A cross-entropy kernel that reads a
    saved float32 log-sum-exp (the committed one until session 29; tests/saved_specs' lse spec), whose rounding (half an ulp of |lse|, 4e-6 near 90) is all of
    1 - p at a confident target; times a loss scale of 2^16 it passed the spec's float16 atol
    (1e-3), and the H200 rejected the kernel (session 26) though its error is 4e-6 of the
    gradient's own scale. The same arithmetic here, on the verifier's own draws, passes; an answer
    that drops 1 - p at twice that scale does not."""
    from specgen.verify.checks import check_close
    from specgen.verify.verdict import Failure

    spec = load_spec(Path(__file__).resolve().parent / "saved_specs" / "cross_entropy_lse.yaml")
    for seed in range(30, 40):
        data = prepare(spec, make_case({"N": 97, "C": 3}, "float16", seed=seed, distribution="large", offset=4),
                       "backward", "cpu")
        assert data.atol["grad_logits"] == pytest.approx(1e-3 * LOSS_SCALE)
        x, target = data.inputs["logits"].float(), data.inputs["target"]
        lse, g = data.inputs["saved_lse"].float(), data.inputs["grad_out"].float()
        p = torch.exp(x - lse[:, None])
        onehot = torch.nn.functional.one_hot(target, 3).float()
        check_close(data, {"grad_logits": ((p - onehot) * g / 97).half()})
    with pytest.raises(Failure):
        check_close(data, {"grad_logits": ((p - onehot) * 2 * g / 97).half()})


def test_errors_of_loss_scaled_cases_are_recorded_in_unscaled_units():
    """The verdict and the lock put the kernel's largest error beside the spec's unscaled atol."""
    from conftest import SPECS
    from specgen.verify.checks import check_close

    spec = load_spec(SPECS / "cross_entropy.yaml")
    data = prepare(spec, make_case({"N": 7, "C": 5}, "float32", seed=1, distribution="large"), "backward", "cpu")
    assert data.scale == LOSS_SCALE
    off = data.truth["grad_logits"] + 1e-6 * LOSS_SCALE  # 1e-6 of the gradient's own scale
    stats = {}
    check_close(data, {"grad_logits": off.float()}, stats=stats)
    assert stats["max_abs_error"] == pytest.approx(1e-6, rel=0.05)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_lean_case_has_a_float32_truth_for_16_bit_inputs_and_no_reference_of_its_own(direction):
    """The case past 2^31 elements is prepared lean (its truth in float32 for float16/bfloat16, the
    truth standing for the working-dtype reference): an honest answer passes, a wrong row fails."""
    from specgen.verify.checks import check_close
    from specgen.verify.verdict import Failure

    from conftest import SPECS

    spec = load_spec(SPECS / "softmax.yaml")
    data = prepare(spec, make_case({"N": 6, "D": 300}, "bfloat16", seed=5), direction, "cpu", lean=True)
    name = data.outputs[0].name
    assert data.truth[name].dtype == torch.float32 and data.reference[name] is data.truth[name]
    honest = {slot.name: data.truth[slot.name].to(slot.dtype) for slot in data.outputs}
    check_close(data, honest)
    wrong = dict(honest)
    wrong[name] = honest[name].clone()
    wrong[name][-1] = honest[name][0]  # the last row is another row's: an offset that wrapped
    with pytest.raises(Failure):
        check_close(data, wrong)
    wide = prepare(spec, make_case({"N": 6, "D": 300}, "float32", seed=5), direction, "cpu", lean=True)
    # a float32 case is prepared in full: its float64 truth and its own reference for the widening
    assert wide.truth[name].dtype == torch.float64 and wide.reference[name] is not wide.truth[name]
