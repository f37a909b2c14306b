"""Comparison with the float64 truth: tolerance, NaN/Inf handling, where the errors are."""
from __future__ import annotations

import torch

from specgen.verify.compare import bitwise_equal, compare, effective_atol, locate, reference_error


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


def test_tolerance_widens_to_four_times_the_references_error():
    truth = torch.tensor([1.0, 2.0], dtype=torch.float64)
    ref = torch.tensor([1.0, 2.01], dtype=torch.float64)
    assert abs(reference_error(ref, truth) - 0.01) < 1e-12
    assert abs(effective_atol(1e-3, 0.01) - 0.04) < 1e-12
    assert effective_atol(1e-3, 1e-6) == 1e-3


def test_bitwise_equal_sees_nan_payload_and_signed_zero():
    a = torch.tensor([0.0, float("nan")])
    assert bitwise_equal(a, a.clone())
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert bitwise_equal(torch.tensor([1, 2], dtype=torch.bfloat16), torch.tensor([1, 2], dtype=torch.bfloat16))
