"""The comparison a slice at a time (compare.CHUNK_ELEMENTS) gives the same verdict, the same
worst element and the same statistics as in one piece: full-size outputs are compared in
slices so that their float64 temporaries fit beside the case (the H200 ran out of memory)."""
import pytest
import torch

from specgen.verify import compare as cmp


def outputs(seed: int, dtype=torch.float16, n=(37, 53)):
    gen = torch.Generator().manual_seed(seed)
    truth = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    reference = truth.to(dtype)
    got = truth.to(dtype).clone()
    flat = got.view(-1)
    picks = torch.randint(0, flat.numel(), (9,), generator=gen)
    flat[picks[:4]] += 0.5  # wrong values
    flat[picks[4]] = float("nan")
    flat[picks[5]] = float("inf")
    truth.view(-1)[picks[6]] = float("nan")  # a non-finite truth the kernel misses
    return got, truth, reference


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_slices_give_the_same_mismatch_as_one_piece(monkeypatch, seed, dtype):
    got, truth, reference = outputs(seed, dtype)
    whole_mask = cmp.matches(got, truth, 1e-3, 1e-3, reference)
    whole = cmp.compare(got, truth, 1e-3, 1e-3, reference)
    monkeypatch.setattr(cmp, "CHUNK_ELEMENTS", 7)  # many slices, one not full
    sliced_mask = cmp.matches(got, truth, 1e-3, 1e-3, reference)
    sliced = cmp.compare(got, truth, 1e-3, 1e-3, reference)
    assert torch.equal(whole_mask, sliced_mask)
    assert whole is not None and sliced is not None
    assert (sliced.bad, sliced.index, sliced.where) == (whole.bad, whole.index, whole.where)
    assert sliced.max_abs == pytest.approx(whole.max_abs) and sliced.max_rel == pytest.approx(whole.max_rel)
    assert sliced.max_rel == sliced.max_rel  # a NaN truth adds no NaN to the statistics
    assert whole.bad >= 6  # four wrong values, a NaN, an Inf, the missed NaN truth


@pytest.mark.parametrize("scale_errors", [False, True])
def test_the_widening_rule_in_slices_matches_the_whole(monkeypatch, scale_errors):
    """Both modes of the rule: a reference that only rounds, and one whose error does not
    scale with the value (a long sum's) whose RMS scale is gathered slice by slice."""
    gen = torch.Generator().manual_seed(5)
    truth = torch.randn(40, 30, generator=gen, dtype=torch.float64)
    reference = truth.to(torch.float16)
    if scale_errors:
        reference = (truth + 0.01 * torch.randn(40, 30, generator=gen, dtype=torch.float64)).to(torch.float16)
    whole = cmp.widening_rule(reference, truth)
    monkeypatch.setattr(cmp, "CHUNK_ELEMENTS", 11)
    sliced = cmp.widening_rule(reference, truth)
    assert sliced.mode == whole.mode == ("scaled" if scale_errors else "relative")
    assert sliced.factor == pytest.approx(whole.factor) and sliced.scale == pytest.approx(whole.scale)


def test_an_exact_output_matches_in_slices(monkeypatch):
    monkeypatch.setattr(cmp, "CHUNK_ELEMENTS", 5)
    truth = torch.linspace(-4, 4, 101, dtype=torch.float64)
    assert cmp.compare(truth.to(torch.bfloat16), truth, 1e-2, 1e-2, truth.to(torch.bfloat16)) is None
