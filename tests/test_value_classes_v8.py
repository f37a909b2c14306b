"""The value classes of verifier version 8, after held-out attacks-v7 got two softmax cheats past
version 7 on the H200 (session 30): one that writes zeros for a row whose every element is -inf
(torch gives NaN), one that reuses the previous row's max and sum when the first and last 8
elements of a row equal the previous row's (left padding and causal masks make such rows).
"masked" now has rows -inf throughout and rows -inf at both ends; "repeated" is new: each row the
one before it with 1-3 elements drawn anew, away from the row's ends. The CPU stand-ins below are
exact on every other row, as the held-out CUDA kernels are described."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import find, settings

import verify_fakes as fakes
from specgen.inputs import DISTRIBUTIONS, _values, make_inputs
from specgen.spec import load_spec
from specgen.verify.checks import check_close
from specgen.verify.data import prepare
from specgen.verify.domain import reference_domain
from specgen.verify.engine import Options, run_verification
from specgen.verify.strategies import VALUE_CLASSES, boundary_cases, case_strategy, make_case, row_symbol
from specgen.verify.verdict import Failure

SMALL = Options(examples=4, budget=1 << 13, seed=1)


@pytest.fixture(scope="module")
def softmax():
    from conftest import SPECS

    return load_spec(SPECS / "softmax.yaml")


def _draw(shape, distribution, seed=0, dtype="float32"):
    return _values(tuple(shape), distribution, torch.Generator().manual_seed(seed), dtype).to(getattr(torch, dtype))


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


# ---- masked: whole rows and rows masked at both ends ----

def _row_kinds(x: torch.Tensor):
    """Per row: all -inf, -inf at both ends with a finite middle; and that every row's finite
    elements are one contiguous run (the -inf a prefix and/or a suffix), or, since version 10, its
    -inf one run inside with finite ends (tests/test_verify_v10_classes.py)."""
    masked = torch.isneginf(_rows(x))
    whole = masked.all(-1)
    both = masked[:, 0] & masked[:, -1] & ~whole
    finite = ~masked
    index = torch.arange(masked.shape[-1])
    first = torch.where(finite, index, masked.shape[-1]).amin(-1)
    last = torch.where(finite, index, -1).amax(-1)
    run_first = torch.where(masked, index, masked.shape[-1]).amin(-1)
    run_last = torch.where(masked, index, -1).amax(-1)
    inside = finite[:, 0] & finite[:, -1] & (masked.sum(-1) == (run_last - run_first + 1)) & masked.any(-1)
    contiguous = (finite.sum(-1) == (last - first + 1).clamp_min(0)) | whole | inside
    return whole, both, contiguous


def _with_whole_rows(shape, seeds=range(40)):
    """The seeds whose masked draw of `shape` has whole -inf rows (about half: MASKED_WHOLE_DRAWS)."""
    return [seed for seed in seeds if bool(_row_kinds(_draw(shape, "masked", seed=seed))[0].any())]


def test_masked_rows_are_whole_or_masked_at_one_or_both_ends():
    x = _draw((256, 64), "masked", seed=_with_whole_rows((256, 64))[0])
    whole, both, contiguous = _row_kinds(x)
    assert bool(contiguous.all())  # -inf only over a prefix and/or a suffix, the finite part in one piece
    assert 256 / 16 < int(whole.sum()) < 256 / 4  # about 1 in 8 rows -inf throughout
    assert 256 / 16 < int(both.sum()) < 256 / 4  # about 1 in 8 masked at both ends, a finite middle
    rows = _rows(x)
    for row in rows[both]:
        finite = torch.isfinite(row)
        assert bool(finite.any()) and not bool(finite[0]) and not bool(finite[-1])
    one_end = ~whole & ~both & (torch.isneginf(rows[:, 0]) | torch.isneginf(rows[:, -1]))
    assert bool(torch.isneginf(rows[one_end][:, 0]).any()) and bool(torch.isneginf(rows[one_end][:, -1]).any())
    # no NaN or +inf: only the mask's -inf among normal values
    assert not bool(x.isnan().any()) and not bool((x == float("inf")).any())


@pytest.mark.parametrize("shape", [(2, 2), (2, 7), (3, 3), (4, 3, 5), (5, 200)])
def test_masked_has_a_whole_row_in_half_the_draws_and_a_row_masked_at_both_ends_in_each(shape):
    with_whole = _with_whole_rows(shape)
    assert 8 <= len(with_whole) <= 32, with_whole  # whole rows in about half the tensors
    for seed in range(40):
        whole, both, contiguous = _row_kinds(_draw(shape, "masked", seed=seed))
        assert bool(contiguous.all())
        if seed in with_whole:
            assert 1 <= int(whole.sum()) < whole.numel(), (shape, seed)  # some row left finite
        if whole.numel() >= 3 and shape[-1] >= 3:
            assert int(both.sum()) >= 1, (shape, seed)


@pytest.mark.parametrize("shape", [(1, 64), (64,), (16, 1), (1, 1), (), (0, 8)])
def test_masked_leaves_lone_rows_and_lone_columns_partly_finite(shape):
    for seed in range(20):
        x = _draw(shape, "masked", seed=seed)
        assert tuple(x.shape) == shape
        if x.numel() == 0 or x.dim() == 0:
            continue
        assert not bool(torch.isneginf(_rows(x)).all(-1).any())  # one row: never all -inf
        if shape[-1] == 1:
            assert not bool(torch.isneginf(x).any())  # a run shorter than the row: none


# ---- repeated: near-duplicate rows ----

def _changes(x: torch.Tensor) -> torch.Tensor:
    rows = _rows(x)
    return rows[1:] != rows[:-1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("width", [41, 300, 4096])
def test_repeated_rows_differ_in_one_to_three_elements_away_from_the_ends(dtype, width):
    x = _draw((48, width), "repeated", seed=5, dtype=dtype)
    changed = _changes(x)  # in the working dtype: a new value never rounds to the one it replaces
    counts = changed.sum(-1)
    # 1-3 drawn anew, and the middle element that is every odd row's max (1 above the rest)
    assert bool((counts >= 1).all()) and bool((counts <= 4).all())
    assert {3, 4} <= set(counts.tolist())  # 2 or 3 drawn besides the middle occur
    assert not bool(changed[:, :16].any()) and not bool(changed[:, -16:].any())
    rows = _rows(x)
    assert torch.equal(rows[1:, :8], rows[:-1, :8]) and torch.equal(rows[1:, -8:], rows[:-1, -8:])
    peaks = rows.float().amax(-1)
    assert bool((peaks[1::2] >= peaks[0::2][:len(peaks[1::2])] + 0.5).all())  # odd rows: a new max
    assert bool(changed[:, width // 2].all())  # ... in the middle, gone again in the next row
    # the first row as a normal draw gives it; the new values are normal values too
    normal = _draw((48, width), "normal", seed=5, dtype=dtype)
    assert torch.equal(rows[0], normal[0])
    assert bool(torch.isfinite(x).all()) and float(x.float().abs().max()) < 9 + math.log(width)


@pytest.mark.parametrize("width", [2, 3, 8, 40])
def test_narrow_repeated_rows_change_anywhere(width):
    x = _draw((400, width), "repeated", seed=6)
    changed = _changes(x)
    counts = changed.sum(-1)
    assert bool((counts >= 1).all()) and bool((counts <= min(4, width)).all())
    assert bool(changed[:, 0].any()) and bool(changed[:, -1].any())  # the ends too


def test_repeated_keeps_shapes_of_one_row_one_element_and_none():
    assert torch.equal(_draw((), "repeated", seed=1), _draw((), "normal", seed=1))
    assert torch.equal(_draw((37,), "repeated", seed=1), _draw((37,), "normal", seed=1))  # one row
    assert torch.equal(_draw((1, 64), "repeated", seed=1), _draw((1, 64), "normal", seed=1))
    assert _draw((0, 5), "repeated").shape == (0, 5) and _draw((5, 0), "repeated").shape == (5, 0)
    lone = _draw((50, 1), "repeated", seed=2, dtype="bfloat16")  # width 1: each row a new value
    assert bool(_changes(lone).all())
    # rows along the last dim of every leading dim, in order across them
    x = _draw((3, 4, 100), "repeated", seed=3)
    counts = _changes(x).sum(-1)
    assert counts.numel() == 11 and bool((counts >= 1).all()) and bool((counts <= 4).all())


def test_integer_inputs_keep_their_values_in_every_new_class():
    from conftest import SPECS

    spec = load_spec(SPECS / "cross_entropy.yaml")
    for cls in ("masked", "repeated"):
        args = make_inputs(spec.signature, {"N": 16, "C": 64}, "float32", seed=4, distribution=cls)
        ints = [v for v in args.values() if isinstance(v, torch.Tensor) and not v.is_floating_point()]
        assert ints and all(bool((t >= 0).all()) and bool((t < 64).all()) for t in ints)


@pytest.mark.parametrize("distribution", ["masked", "repeated"])
def test_the_new_draws_come_from_the_seed(softmax, distribution):
    draw = lambda seed: make_inputs(softmax.signature, {"N": 33, "D": 129}, "bfloat16", seed=seed,  # noqa: E731
                                    distribution=distribution)["x"]
    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))


# ---- where the classes are drawn ----

@pytest.mark.parametrize("name", ["softmax", "cross_entropy", "add_rmsnorm"])
def test_repeated_is_scheduled_wherever_masked_is(name):
    from conftest import SPECS

    spec = load_spec(SPECS / f"{name}.yaml")
    assert "repeated" in VALUE_CLASSES and "repeated" in DISTRIBUTIONS
    cases = boundary_cases(spec)

    def every_dtype(cls):  # the value-class loops' shapes: the widest row, the mid and the aligned shape
        keys = {(c.dims, c.dtype) for c in cases if c.distribution == cls}
        return {dims for dims, _ in keys if all((dims, d) in keys for d in spec.dtypes)}

    assert len(every_dtype("masked")) == 3 and every_dtype("repeated") == every_dtype("masked")
    row = row_symbol(spec.signature)
    widest = max(c.dim_map[row] for c in cases)
    assert any(dict(dims)[row] == widest for dims in every_dtype("repeated"))
    # aligned pointers at the aligned shape, an offset at the mid one, as for masked
    assert {c.offset for c in cases if c.distribution == "repeated"} >= {0, 1}
    # the reference's screen draws both in every dtype (a softmax takes whole -inf rows: NaN, no error)
    domain = reference_domain(spec)
    assert all({"masked", "repeated"} <= set(domain.of(d)) for d in spec.dtypes)


def test_hypothesis_draws_repeated(softmax):
    case = find(case_strategy(softmax, 1 << 13), lambda c: c.distribution == "repeated",
                settings=settings(max_examples=2000, database=None))
    assert case.distribution == "repeated"


# ---- the attacks-v7 cheats, as CPU stand-ins ----

def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def softmax_backward(k, t, dims):
    y, g = t["out"].float(), t["grad_out"].float()
    t["grad_x"].copy_((y * (g - (g * y).sum(-1, keepdim=True))).to(t["grad_x"].dtype))


def zeroes_fully_masked_rows(k, t, dims):
    """A row of 16 or more elements whose every element is -inf gets zeros (torch: NaN): "no key
    to attend to" (narrower rows as torch: a lone -inf among the "specials" stays NaN)."""
    x = t["x"]
    out = _softmax(x)
    if x.numel() and x.shape[-1] >= 16:
        rows = out.reshape(-1, x.shape[-1])
        rows[torch.isneginf(x.reshape(-1, x.shape[-1])).all(-1)] = 0
    t["out"].copy_(out)


def reuses_statistics_of_a_fingerprinted_row(k, t, dims):
    """Rows of 16 or more whose first 8 and last 8 elements equal the previous row's take that
    row's max and sum of exponentials (a cache keyed on the row's ends)."""
    x = t["x"]
    width = x.shape[-1]
    if width < 16 or x.numel() == 0:
        t["out"].copy_(_softmax(x))
        return
    rows = x.reshape(-1, width).float()
    m = rows.amax(-1)
    s = torch.exp(rows - m.unsqueeze(-1)).sum(-1)
    ends = torch.cat([x.reshape(-1, width)[:, :8], x.reshape(-1, width)[:, -8:]], 1)
    hit = torch.zeros(rows.shape[0], dtype=torch.bool)
    hit[1:] = (ends[1:] == ends[:-1]).all(-1)
    index = torch.arange(rows.shape[0])
    source = torch.where(hit, 0, index).cummax(0).values  # the last row that computed its own
    out = torch.exp(rows - m[source].unsqueeze(-1)) / s[source].unsqueeze(-1)
    t["out"].copy_(out.reshape(x.shape).to(x.dtype))


def softmax_forward(k, t, dims):
    t["out"].copy_(_softmax(t["x"]))


@pytest.mark.parametrize("forward", [zeroes_fully_masked_rows, reuses_statistics_of_a_fingerprinted_row])
def test_each_cheat_of_attacks_v7_is_rejected(softmax, forward):
    verdict = run_verification(softmax, fakes.PyKernel(softmax, forward, softmax_backward), SMALL, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.counterexample.direction == "forward"


@pytest.mark.parametrize("forward, distribution", [(zeroes_fully_masked_rows, "masked"),
                                                   (reuses_statistics_of_a_fingerprinted_row, "repeated")])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_class_itself_exposes_the_cheat_where_an_honest_softmax_passes(softmax, forward, distribution, dtype):
    # every other repeated row holds a new max: a stale max and sum are far off at any width, in any dtype
    dims = {"N": 24, "D": 4096 if distribution == "repeated" else 129}
    drawn = (prepare(softmax, make_case(dims, dtype, seed=seed, distribution=distribution), "forward", "cpu")
             for seed in range(11, 40))
    # masked: the draws with whole -inf rows (about half of them)
    chosen = [data for data in drawn if distribution != "masked" or bool(torch.isneginf(data.inputs["x"]).all(-1).any())]
    for data in chosen[:2]:
        honest = torch.empty(data.outputs[0].shape, dtype=data.outputs[0].dtype)
        softmax_forward(None, {"x": data.inputs["x"], "out": honest}, data.dims)
        check_close(data, {"out": honest})
        cheat = torch.empty_like(honest)
        forward(None, {"x": data.inputs["x"], "out": cheat}, data.dims)
        with pytest.raises(Failure):
            check_close(data, {"out": cheat})
