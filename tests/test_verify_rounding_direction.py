"""Verifier version 13: a 16-bit output rounded in one direction (truncation, toward +-inf) fails
though each element is within its tolerance (compare.rounding_bias; held-out attacks-v10's
fused add + RMSNorm truncated its bfloat16 results)."""
from __future__ import annotations

import pytest
import torch

from specgen.verify.compare import MIN_BIASED, rounding_bias
from specgen.verify.verdict import WRONG_RESULT, Failure


def truncated(values: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 keeping the upper 16 bits: rounding toward zero."""
    bits = values.float().contiguous().view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32).to(torch.bfloat16)


def directed(values: torch.Tensor, dtype: torch.dtype, toward: str) -> torch.Tensor:
    """Rounded to nearest, then moved one ulp where that went the other way: a directed rounding."""
    rounded = values.to(dtype)
    back = rounded.double()
    if toward == "zero":
        wrong, target = back.abs() > values.double().abs(), torch.zeros_like(rounded)
    elif toward == "up":
        wrong, target = back < values.double(), torch.full_like(rounded, float("inf"))
    else:
        wrong, target = back > values.double(), torch.full_like(rounded, -float("inf"))
    return torch.where(wrong, torch.nextafter(rounded, target), rounded)


def normal_truth(rows: int = 256, cols: int = 400, seed: int = 0) -> torch.Tensor:
    """~10^5 normal values, float64 truth of a float32 computation (not representable in 16 bits)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen).float().double()


def test_truncated_bfloat16_results_are_rejected_with_the_reason_and_the_fix():
    truth = normal_truth()
    got = truncated(truth)
    assert bool(((got.double() - truth).abs() <= 2 ** -7 * truth.abs()).all())  # each within one ulp
    bias = rounding_bias(got, truth)
    assert bias is not None and bias.direction == "toward zero"
    assert bias.fraction > 0.99 and bias.elements > 0.9 * truth.numel()
    text = bias.describe("residual_out")
    for words in ("'residual_out'", "rounded in one direction", "truncation instead of round-to-nearest-even",
                  "residual stream", "__float2bfloat16_rn", "__float2half_rn", "upper 16 bits", f"{bias.elements}"):
        assert words in text, words
    expected, value = bias.expected, bias.got
    assert abs(value) < abs(expected)  # the example element errs toward zero


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("toward, direction", [("zero", "toward zero"), ("up", "upward"), ("down", "downward")])
def test_each_directed_rounding_is_rejected(dtype, toward, direction):
    truth = normal_truth(seed=1)
    bias = rounding_bias(directed(truth, dtype, toward), truth)
    assert bias is not None and bias.direction == direction and bias.fraction > 0.99


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_to_nearest_passes(dtype):
    truth = normal_truth(seed=2)
    assert rounding_bias(truth.to(dtype), truth) is None
    # rounded twice (float32 math, then 16 bits), as a float32 kernel does: unbiased too
    assert rounding_bias(truth.float().to(dtype), truth) is None
    # several roundings in 16-bit as torch does (x * s rounded, then * w rounded)
    x, s, w = truth.to(dtype), torch.tensor(1.37, dtype=dtype), normal_truth(1, 400, seed=3).to(dtype)
    exact = x.double() * s.double() * w.double()
    assert rounding_bias((x * s) * w, exact) is None


def test_ties_rounded_away_from_zero_are_rejected_where_ties_are_common():
    """x + y of two bfloat16 values in [1, 2): every inexact sum is an exact tie.
    Round-to-nearest-even splits them both ways; adding half an ulp before cutting the bits
    (0x8000) rounds them all up in magnitude."""
    gen = torch.Generator().manual_seed(4)
    x = (torch.rand(256, 400, generator=gen) + 1).to(torch.bfloat16)
    y = -(torch.rand(256, 400, generator=gen) + 1).to(torch.bfloat16)  # negative sums, too
    y[::2] = -y[::2]
    truth = x.double() + y.double()
    assert rounding_bias(x + y, truth) is None  # torch's own round-to-nearest-even
    half_up = ((truth.float().view(torch.int32) + 0x8000) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    bias = rounding_bias(half_up, truth)
    assert bias is not None and bias.direction == "away from zero"


def test_exact_outputs_and_few_inexact_elements_never_fail():
    truth = normal_truth(seed=5).to(torch.bfloat16).double()  # every element representable
    assert rounding_bias(truth.to(torch.bfloat16), truth) is None
    assert rounding_bias(truncated(truth), truth) is None  # truncation is exact here too
    scattered = torch.randperm(truth.numel(), generator=torch.Generator().manual_seed(5))
    nudge = 1 + 2 ** -7 * torch.rand(truth.numel(), generator=torch.Generator().manual_seed(6)).double()
    inexact = truth.clone()
    some = scattered[: MIN_BIASED - 1]
    inexact.view(-1)[some] *= nudge[some]  # 1999 elements the dtype does not hold
    got = truncated(inexact)  # exact where it can be; toward zero at the 1999 others
    assert int((got.double() != inexact).sum()) == MIN_BIASED - 1
    assert rounding_bias(got, inexact) is None
    assert rounding_bias(inexact.to(torch.bfloat16), inexact) is None
    more = scattered[MIN_BIASED - 1: 3 * MIN_BIASED]
    inexact.view(-1)[more] *= nudge[more]  # enough of them: now it counts
    assert rounding_bias(truncated(inexact), inexact) is not None
    assert rounding_bias(inexact.to(torch.bfloat16), inexact) is None


def test_a_float32_output_is_not_judged():
    truth = normal_truth(seed=6)
    biased = (truth * (1 - 2 ** -22)).float()  # every element a few float32 ulps toward zero
    assert bool(((biased.double() - truth).abs() > 0).all()) and bool((biased.double().abs() < truth.abs()).all())
    assert rounding_bias(biased, truth) is None


def test_only_normal_finite_truths_and_rounding_sized_errors_count():
    """Saturation past the range, flush to zero of subnormal truths, NaN/inf, and errors far
    larger than a rounding are no rounding direction: a float16 output whose errors there all go
    toward zero passes while its normal elements round to nearest."""
    truth = normal_truth(seed=7)
    flat = truth.view(-1)
    flat[0::4] = flat[0::4].sign() * 1e5  # past float16's max: saturated at 65504 below
    flat[1::4] *= 1e-7  # subnormal (or below) in float16: flushed to zero below
    flat[2::8] = float("nan")
    got = truth.to(torch.float16)
    got.view(-1)[0::4] = got.view(-1)[0::4].sign() * 65504
    got.view(-1)[1::4] = 0
    got.view(-1)[3::8] *= 0.99  # errors of 10 ulps toward zero: a computation's, not a rounding's
    assert rounding_bias(got, truth) is None
    got.view(-1)[2::4] = directed(truth.view(-1)[2::4], torch.float16, "zero")  # the rounding itself: caught
    got.view(-1)[3::8] = directed(truth.view(-1)[3::8], torch.float16, "zero")
    assert rounding_bias(got, truth) is not None


def test_few_rows_or_columns_and_1d_outputs_are_not_judged():
    """A row's scale rounded to 16 bits shifts that whole row one way: over a few rows that is
    chance, not a rounding direction (compare.py, MIN_GROUPS)."""
    for rows, cols in ((3, 16384), (16384, 3), (1, 50000)):
        truth = normal_truth(rows, cols, seed=8)
        assert rounding_bias(truncated(truth), truth) is None
    truth = normal_truth(1, 50000, seed=8).view(-1)
    assert rounding_bias(truncated(truth), truth) is None


def test_a_row_scale_rounded_to_16_bits_over_many_rows_passes():
    """x * rstd with each row's rstd rounded to bfloat16 (a kernel using __hmul2) errs one way
    per row at random: over 128 rows it is no bias."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(128, 1024, generator=gen).to(torch.bfloat16)
    scale = torch.rand(128, 1, generator=gen).double() * 3 + 0.1
    truth = x.double() * scale
    assert rounding_bias((x * scale.to(torch.bfloat16)), truth) is None
    assert rounding_bias((x.float() * scale.to(torch.bfloat16).float()).to(torch.bfloat16), truth) is None


def test_a_reference_or_correct_rounding_as_biased_excuses_the_kernel():
    """Data whose correct rounding leans one way by itself (x + a tiny positive y rounds back to
    x), and torch's own 16-bit roundings (one scale rounded for the whole tensor)."""
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(256, 400, generator=gen).to(torch.bfloat16).double()
    truth = x + x * 2 ** -12 * torch.rand(256, 400, generator=gen).double()  # tiny, away from zero
    assert rounding_bias(truth.to(torch.bfloat16), truth) is None  # all toward zero, as correct rounding is
    assert rounding_bias(truncated(truth), truth) is None  # the same answer here
    # one scale for the whole tensor, rounded by torch (and by a kernel that follows it)
    x = torch.randn(256, 400, generator=gen).to(torch.bfloat16)
    scale = torch.tensor(1.0039, dtype=torch.float64)  # rounds to 1.0 in bfloat16: 0.39% down
    truth = x.double() * scale
    reference = x * scale.to(torch.bfloat16)
    follows = (x.float() * scale.to(torch.bfloat16).float()).to(torch.bfloat16)
    assert rounding_bias(follows, truth) is not None  # on its own: every element toward zero
    assert rounding_bias(follows, truth, reference) is None  # as torch's reference is
    assert rounding_bias(directed(truth, torch.bfloat16, "up"), truth, reference) is not None  # not the other way


def test_large_outputs_are_sampled():
    from specgen.verify import compare

    truth = normal_truth(512, 1024, seed=11)
    old = compare.SAMPLE_ELEMENTS
    compare.SAMPLE_ELEMENTS = 1 << 14
    try:
        bias = rounding_bias(truncated(truth), truth)
        assert bias is not None and bias.sampled <= 1 << 14 and bias.total == truth.numel()
        assert "strided sample" in bias.describe("out")
        assert rounding_bias(truth.to(torch.bfloat16), truth) is None
    finally:
        compare.SAMPLE_ELEMENTS = old


def add_rmsnorm_outputs(data, truncate: bool) -> dict:
    x, residual, w = data.inputs["x"], data.inputs["residual"], data.inputs["weight"]
    s = truncated(x.float() + residual.float()) if truncate else x + residual
    rstd = torch.rsqrt(s.float().pow(2).mean(-1) + 1e-6)
    y = s.float() * rstd[..., None] * w.float()
    return {"out": truncated(y) if truncate else y.to(torch.bfloat16), "residual_out": s, "saved_rstd": rstd}


@pytest.mark.parametrize("lean", [False, True])
def test_the_held_out_fused_add_rmsnorm_truncation_is_rejected_by_check_close(lean):
    """End to end through the verifier's case data (the spec of held-out attacks-v10's cheat): the
    honest float32-math kernel passes, the truncating one fails with wrong-result; a lean case
    (float32 truth standing for the reference) gets its reference first and fails the same."""
    from conftest import SPECS
    from specgen.spec import load_spec
    from specgen.verify.checks import check_close
    from specgen.verify.data import prepare
    from specgen.verify.strategies import make_case

    spec = load_spec(SPECS / "add_rmsnorm.yaml")
    data = prepare(spec, make_case({"N": 128, "D": 512}, "bfloat16", seed=3), "forward", "cpu", lean=lean)
    check_close(data, add_rmsnorm_outputs(data, truncate=False))
    with pytest.raises(Failure) as failed:
        check_close(data, add_rmsnorm_outputs(data, truncate=True))
    assert failed.value.reason == WRONG_RESULT
    assert "rounded in one direction" in failed.value.detail and "toward zero" in failed.value.detail
    ce = failed.value.counterexample
    assert ce.output in ("out", "residual_out") and ce.bad_elements and ce.index is not None
    assert abs(ce.got) < abs(ce.expected)
