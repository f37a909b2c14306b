"""Comparison with the float64 truth: tolerance, NaN/Inf handling, where the errors are."""
from __future__ import annotations

import pytest
import torch

from specgen.verify.compare import bitwise_equal, compare, element_tolerance, locate


def test_within_tolerance_is_none_and_nan_must_match():
    truth = torch.tensor([1.0, float("nan"), float("inf"), -2.0], dtype=torch.float64)
    assert compare(truth.float(), truth, 1e-6, 1e-6) is None
    got = torch.tensor([1.0, 0.0, float("inf"), -2.0])
    m = compare(got, truth, 1e-6, 1e-6)
    assert m is not None and m.bad == 1 and m.index == [1]


def test_nan_where_the_truth_is_finite_is_reported():
    truth = torch.zeros(4, 8, dtype=torch.float64)
    got = torch.zeros(4, 8)
    got[2, 5] = float("nan")
    m = compare(got, truth, 1e-3, 1e-3)
    assert m.bad == 1 and m.index == [2, 5]
    assert any("NaN in 1" in w for w in m.where)


def test_worst_error_and_relative_error():
    truth = torch.ones(3, 5, dtype=torch.float64)
    got = torch.ones(3, 5)
    got[1, 2] = 1.5
    got[0, 0] = 1.1
    m = compare(got, truth, 1e-3, 0.0)
    assert m.index == [1, 2] and abs(m.max_abs - 0.5) < 1e-6 and abs(m.max_rel - 0.5) < 1e-6
    assert m.expected == 1.0 and m.got == 1.5


def test_locate_tail_first_row_and_columns():
    mask = torch.zeros(4, 10, dtype=torch.bool)
    mask.view(-1)[37:] = True
    assert any(w.startswith("tail: flat elements 37..39") for w in locate(mask))
    mask = torch.zeros(4, 10, dtype=torch.bool)
    mask[0, :] = True
    assert "first row only" in locate(mask)
    mask = torch.zeros(4, 10, dtype=torch.bool)
    mask[:, 8:] = True
    where = locate(mask)
    assert "every row (4)" in where and any("columns 8..9 of 10" in w for w in where)


def test_tolerance_widens_element_by_element_where_the_reference_errs():
    """The reference's own error buys slack at that element only (issue 11: a large error at a
    large value once widened the whole tensor, letting small outputs be zeroed)."""
    truth = torch.cat([torch.full((999,), 1.0), torch.tensor([1000.0])]).double()
    ref = truth * (1 + 2.0 ** -9)  # bf16-like rounding: relative to each value
    tol = element_tolerance(torch.float64, truth, 1e-3, 0.0, ref)
    assert float(tol[-1]) > 1.9  # 2 x its own error (~1.95) at the large value
    assert float(tol[0]) < 0.5  # a small value keeps a small tolerance: no whole-tensor widening
    got = truth.clone()
    got[0] = 0.0  # a small output zeroed
    got[-1] = 1001.5  # within its own widening
    mismatch = compare(got, truth, 1e-3, 0.0, reference=ref)
    assert mismatch is not None and mismatch.bad == 1 and mismatch.index == [0]


def test_a_sums_error_that_does_not_scale_with_the_value_widens_every_element():
    """A column sum's rounding depends on its terms, not on the result: the reference may be
    exact by luck at one element while an honest kernel (another summation order) is not."""
    gen = torch.Generator().manual_seed(0)
    truth = torch.randn(4096, generator=gen, dtype=torch.float64)
    ref = truth + torch.randn(4096, generator=gen, dtype=torch.float64) * 1e-5
    ref[7] = truth[7]  # exact by luck here
    got = truth + torch.randn(4096, generator=gen, dtype=torch.float64) * 1e-5
    got[7] = truth[7] + 3e-5
    assert compare(got, truth, 1e-5, 1e-5, reference=ref) is None


def test_a_fast_tanh_in_float32_is_rejected_at_the_spec_tolerance():
    """tanh.approx.f32 (about 11 correct bits) in a float32 GELU: far outside atol = rtol = 1e-5,
    even where the reference (float32) errs by its rounding."""
    x = torch.linspace(-4, 4, 4001, dtype=torch.float64)
    truth = 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
    reference = torch.nn.functional.gelu(x.float(), approximate="tanh")
    inner = (0.7978845608028654 * (x + 0.044715 * x ** 3))
    approx_tanh = torch.tanh(inner) * (1 + 2.0 ** -11 * torch.sign(torch.sin(x * 1000)))  # 11-bit relative error
    got = (0.5 * x * (1 + approx_tanh)).float()
    assert compare(got, truth, 1e-5, 1e-5, reference=reference) is not None
    assert compare(reference, truth, 1e-5, 1e-5, reference=reference) is None


def test_large_values_elsewhere_buy_no_slack_for_a_fast_tanh():
    """The red team's case: a float32 GELU whose tanh errs by ~1.1e-5 relative passed because
    large values in the same tensor widened the tolerance of the small ones. The float32
    reference only rounds, so the slack stays relative to each value."""
    x = torch.cat([torch.linspace(-4, -2, 2001), torch.linspace(50, 150, 2001)]).double()
    inner = 0.7978845608028654 * (x + 0.044715 * x ** 3)
    truth = 0.5 * x * (1 + torch.tanh(inner))
    reference = torch.nn.functional.gelu(x.float(), approximate="tanh")
    got = (0.5 * x * (1 + torch.tanh(inner) * (1 + 1.1e-5))).float()
    mismatch = compare(got, truth, 1e-5, 1e-5, reference=reference)
    assert mismatch is not None and all(float(x[i]) < 0 for i in [mismatch.index[0]])


def test_nan_positions_must_match_the_truth():
    truth = torch.tensor([float("nan"), 1.0, float("inf")], dtype=torch.float64)
    assert compare(torch.tensor([float("nan"), 1.0, float("inf")]), truth, 1e-5, 1e-5) is None
    assert compare(torch.tensor([0.0, 1.0, float("inf")]), truth, 1e-5, 1e-5) is not None  # NaN turned into 0
    assert compare(torch.tensor([float("nan"), 1.0, 0.0]), truth, 1e-5, 1e-5) is not None  # Inf turned into 0
    assert compare(torch.tensor([float("nan"), float("nan"), float("inf")]), truth, 1e-5, 1e-5) is not None


def test_bitwise_equal_sees_nan_payload_and_signed_zero():
    a = torch.tensor([0.0, float("nan")])
    assert bitwise_equal(a, a.clone())
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert bitwise_equal(torch.tensor([1, 2], dtype=torch.bfloat16), torch.tensor([1, 2], dtype=torch.bfloat16))


# ------------------------------------------------------------------ overflow of the working dtype

F16_MAX = 65504.0


def test_the_infinity_a_correct_float16_kernel_returns_past_the_range_matches():
    # swiglu on the H200: expected -71137.03 (float64 truth), a correct float16 kernel gives -inf
    truth = torch.tensor([-71137.03125, 1.5, 70000.0], dtype=torch.float64)
    got = torch.tensor([float("-inf"), 1.5, float("inf")], dtype=torch.float16)
    assert compare(got, truth, 1e-3, 1e-3) is None
    # the wrong infinity, or NaN, still fails even where the truth overflows
    m = compare(torch.tensor([float("inf"), 1.5, float("nan")], dtype=torch.float16), truth, 1e-3, 1e-3)
    assert m is not None and m.bad == 2


def test_an_infinity_within_tolerance_of_the_range_edge_matches_but_not_far_inside_it():
    # 65500 is representable, but 65500 * (1 + 1e-3) rounds to inf: a kernel may land there
    truth = torch.tensor([65500.0, 1000.0], dtype=torch.float64)
    got = torch.tensor([float("inf"), 1000.0], dtype=torch.float16)
    assert compare(got, truth, 1e-3, 1e-3) is None
    assert compare(got, truth, 1e-3, 0.0) is not None  # no tolerance band past 65519: a real overflow
    m = compare(torch.tensor([65504.0, float("inf")], dtype=torch.float16), truth, 1e-3, 1e-3)
    assert m.bad == 1 and m.index == [1]
    assert any("Inf in 1 element(s)" in w and "float16's range (max 65504)" in w for w in m.where)


def test_bfloat16_and_float32_overflow_the_same_way():
    truth = torch.tensor([4e38], dtype=torch.float64)
    for dtype in (torch.bfloat16, torch.float32):
        assert compare(torch.tensor([float("inf")], dtype=dtype), truth, 1e-3, 1e-3) is None


def test_where_the_reference_itself_overflowed_its_infinity_is_accepted_at_that_element_only():
    truth = torch.tensor([30000.0, 1.0, 2.0], dtype=torch.float64)  # all within float16's range
    ref = torch.tensor([float("inf"), 1.0, 2.0], dtype=torch.float16)  # an intermediate overflowed
    got = torch.tensor([float("inf"), 1.0, 2.0], dtype=torch.float16)
    assert compare(got, truth, 1e-3, 1e-3) is not None  # without the reference: a wrong inf
    assert compare(got, truth, 1e-3, 1e-3, reference=ref) is None
    # not poisoned: the other elements are still held to the finite tolerance, NaN still fails
    worse = torch.tensor([float("inf"), 5.0, float("nan")], dtype=torch.float16)
    assert compare(worse, truth, 1e-3, 1e-3, reference=ref).bad == 2
    # where the working dtype overflowed inside the reference, any non-finite value will do (an
    # inf - inf's sign is an accident of the order), but not a finite wrong one
    assert compare(torch.tensor([float("-inf"), 1.0, 2.0], dtype=torch.float16), truth, 1e-3, 1e-3,
                   reference=ref) is None
    assert compare(torch.tensor([7.0, 1.0, 2.0], dtype=torch.float16), truth, 1e-3, 1e-3,
                   reference=ref).bad == 1


def test_a_non_finite_truth_the_reference_misses_in_its_dtype_accepts_the_references_own_value():
    # held-out bce_probs (H200, session 18): d/dt of BCE(sigmoid(z), sigmoid(t)) at a saturated z is
    # -logit(1) * sigmoid'(t) = -inf * (small > 0) in float64, but float32 rounds sigmoid(t) to 1:
    # -inf * 0 = NaN, in the reference's own float32 run as in the kernel
    truth = torch.tensor([float("-inf"), float("-inf"), 1.0], dtype=torch.float64)
    ref = torch.tensor([float("nan"), float("-inf"), 1.0], dtype=torch.float32)
    got = torch.tensor([float("nan"), float("-inf"), 1.0], dtype=torch.float32)
    assert compare(got, truth, 1e-3, 1e-3) is not None  # without the reference: NaN is not -inf
    assert compare(got, truth, 1e-3, 1e-3, reference=ref) is None
    # exactly the reference's value: a finite number, the other infinity, or NaN where the
    # reference kept the truth's infinity still fail
    for wrong in ([5.0, float("-inf"), 1.0], [float("inf"), float("-inf"), 1.0], [float("nan")] * 2 + [1.0]):
        assert compare(torch.tensor(wrong, dtype=torch.float32), truth, 1e-3, 1e-3, reference=ref).bad == 1


def test_the_h200_swiglu_counterexample_passes_for_a_float32_math_kernel():
    """End to end through the verifier's case data: the float16 truth overflows and the
    check a correct kernel used to fail now passes; a kernel that is wrong by 1% still fails."""
    from conftest import SPECS
    from specgen.spec import load_spec
    from specgen.verify.checks import check_close
    from specgen.verify.data import prepare
    from specgen.verify.strategies import make_case
    from specgen.verify.verdict import Failure

    spec = load_spec(SPECS / "swiglu.yaml")
    data = prepare(spec, make_case({"N": 3725, "H": 1}, "float16", distribution="large", seed=1), "forward", "cpu")
    truth = data.truth["out"]
    assert bool((truth.abs() > F16_MAX).any())  # the case really overflows float16
    x = data.inputs["x"].float()
    out = (torch.nn.functional.silu(x[:, :1]) * x[:, 1:]).to(torch.float16)
    assert bool(torch.isinf(out).any())
    check_close(data, {"out": out})
    with pytest.raises(Failure):
        check_close(data, {"out": (out.float() * 1.01).to(torch.float16)})


def test_the_error_norm_ratio_tells_an_all_zero_row_from_an_honest_rounding():
    """Measured, not a check yet (checks.error_norm_ratio): a bfloat16 softmax row of 4096
    near-equal logits has every probability below the spec's atol, so an all-zero row passes
    element by element (held-out attacks-v5); its error norm is hundreds of times the
    reference's, an honest rounding's about the reference's."""
    from specgen.verify.checks import error_norm_ratio

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 4096, dtype=torch.float64, generator=gen) * 0.01
    truth = torch.softmax(logits, dim=-1)
    reference = torch.softmax(logits.to(torch.bfloat16), dim=-1)  # torch in the working dtype
    honest = truth.to(torch.bfloat16)  # the float64 answer rounded once
    assert float(truth.max()) < 8e-3  # below bfloat16's default atol: zeros pass element by element
    assert error_norm_ratio(honest, truth, reference) < 2.0
    assert error_norm_ratio(torch.zeros_like(honest), truth, reference) > 50.0
    assert error_norm_ratio(honest, torch.zeros_like(truth), torch.zeros_like(truth)) is None  # nothing to scale by
