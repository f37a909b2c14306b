"""The case past 2^32 elements with its truth on sampled rows (verify/sampled_rows.py, version 14).

Version 13 planned the case out on the H200 (a float32 truth of 4.3e9 elements did not fit beside
the case, session 38), so held-out attacks-v10's unsigned 32-bit row offsets still passed. On the CPU
the marks are lowered: the stand-in kernels meet them at a few thousand elements."""
from __future__ import annotations

import math

import pytest
import torch

import verify_fakes as fakes
from conftest import SPECS
from specgen.spec import load_spec
from specgen.verify import engine, sampled_rows, starved, strategies
from specgen.verify.engine import Options, run_verification
from specgen.verify.sampled_rows import row_ranges, separable, sliced_symbol

SMALL = Options(examples=4, budget=1 << 13, seed=1)


def spec(name):
    return load_spec(SPECS / f"{name}.yaml")


def test_the_sampled_rows_hold_the_first_the_last_and_those_where_offsets_wrap():
    rows, width = 65536, 128256  # log-probabilities over Llama 3's vocabulary: 8.4e9 elements
    ranges = row_ranges(rows, width)
    covered = {r for a, b in ranges for r in range(a, b)}
    for mark in (1 << 31, 1 << 32):
        at = mark // width  # the row holding element offset `mark`
        assert {at - 1, at, at + 1} <= covered
    assert {0, 1, rows - 2, rows - 1} <= covered
    assert all(a < b <= c for (a, b), (c, _) in zip(ranges, ranges[1:]))  # sorted, disjoint
    assert sum(b - a for a, b in ranges) * width <= sampled_rows.SAMPLED_ROWS_ELEMENTS
    # a mark past the last row adds nothing; rows wider than the budget take one row around each
    assert row_ranges(10, 1 << 20) == [(0, 2), (8, 10)]
    assert row_ranges(4096, 1 << 24)[0] == (0, 1)


@pytest.mark.parametrize("name, direction, separable_rows", [
    ("log_softmax", "forward", True), ("log_softmax", "backward", True),
    ("rmsnorm", "backward", True),  # grad_x row by row; grad_weight (no N first) is not compared
    ("cross_entropy", "backward", False),  # a mean loss: every row's gradient divides by the row count
])
def test_rows_are_sampled_only_where_the_spec_computes_them_row_by_row(name, direction, separable_rows):
    s = spec(name)
    dims = {sym: hi for sym, (lo, hi) in s.dims.items()}
    symbol = sliced_symbol(s, direction, dims)
    assert symbol == "N"
    assert separable(s, direction, symbol, torch.device("cpu")) is separable_rows


def lowered_marks(monkeypatch, mark: int) -> None:
    """The marks where offsets wrap at `mark` and 2 x `mark` elements, every such case on sampled rows."""
    monkeypatch.setattr(strategies, "INT32_ELEMENTS", mark)
    monkeypatch.setattr(sampled_rows, "WRAP_MARKS", (mark, 2 * mark))
    monkeypatch.setattr(engine, "CPU_PAST_INT32_ELEMENTS", 0)  # no whole truth past the marks
    monkeypatch.setattr(engine, "more_rows_case", lambda *args, **kw: None)  # (it would pass the mark itself)
    # (and so would the starved calls' widest row and many rows: starved.py) the smoke shape alone
    monkeypatch.setattr(starved, "starved_cases", lambda spec_, seed, budget: [strategies.smoke_case(spec_, seed)])


def test_an_offset_that_wraps_is_caught_on_the_sampled_rows(monkeypatch):
    gelu = spec("gelu_tanh")
    mark = 1 << 14  # above every other case of SMALL's budget
    lowered_marks(monkeypatch, mark)
    checked = []
    real = sampled_rows.rows_data

    def recording(spec_, data, symbol, ranges):
        checked.append((symbol, ranges, data.dims[symbol]))
        return real(spec_, data, symbol, ranges)

    monkeypatch.setattr(sampled_rows, "rows_data", recording)
    wrapped = run_verification(gelu, fakes.PyKernel(gelu, fakes.wraps_offsets_at(mark)), SMALL, device="cpu")
    assert wrapped.reason == "wrong-result", wrapped.summary()
    assert "truth computed for those rows only" in wrapped.summary()
    assert math.prod(wrapped.counterexample.case["dims"].values()) > mark
    symbol, ranges, rows = checked[0]
    assert symbol == "N" and sum(b - a for a, b in ranges) < rows  # rows sampled, not the whole case

    checked.clear()
    honest = run_verification(gelu, fakes.PyKernel(gelu, fakes.gelu_forward), SMALL, device="cpu")
    assert honest.passed, honest.summary()
    assert len(checked) >= 2  # the cases past both marks, on sampled rows


def test_a_case_whose_rows_are_not_computed_alone_is_named_as_not_run(monkeypatch):
    s = spec("cross_entropy")
    session = engine.Session(s, None, Options(), lambda text: None, device="cpu")
    monkeypatch.setattr(strategies, "INT32_ELEMENTS", 1 << 10)
    monkeypatch.setattr(engine, "CPU_PAST_INT32_ELEMENTS", 0)
    session.past_int32("backward", on_gpu=False, wraps=31)
    assert session.shrunk and "not computed from their own input rows alone" in session.shrunk[-1]


def test_only_a_plain_symbol_is_sliced():
    from specgen.signature import parse_tensor_type
    from specgen.verify.sampled_rows import first_symbol

    assert first_symbol(parse_tensor_type("Tensor[N, D]")) == "N"
    assert first_symbol(parse_tensor_type("Tensor[*N, 2*H]")) == "N"  # swiglu's batch group
    assert first_symbol(parse_tensor_type("Tensor[2*N, D]")) is None  # rows of 2*N are not N's
    assert first_symbol(parse_tensor_type("Tensor[D]")) == "D"
    assert first_symbol(parse_tensor_type("Tensor[4, D]")) is None
