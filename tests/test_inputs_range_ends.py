"""Integers in a declared range meet the range's ends (verifier version 16: inputs.ranged_integers).
A vocabulary's last token is every document's last target (GPT-2's end-of-text is C - 1); held-out
attacks-v11's cross-entropy split few-row rows into whole vectors and a tail and never looked for
the target in the tail, and uniform targets land there with probability tail / C (0.03 tail targets
a verification). The cheat's CPU stand-in below runs through the verifier's own engine."""
from __future__ import annotations

import pytest
import torch

import verify_fakes as fakes
from specgen.inputs import RANGE_END_FRACTION, RANGE_TOP_WINDOW, ranged_integers
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification
from test_verify_chained import ce_backward, ce_forward

SMALL = Options(examples=4, budget=1 << 13, seed=1, endurance=0, directions=("forward",))
VECTOR = 16  # the stand-in's whole vectors: a row's last C % VECTOR columns are its tail


@pytest.mark.parametrize("lo,hi", [(0, 50257), (-3, 200), (0, 2)])
def test_values_stay_in_range_and_meet_both_ends(lo, hi):
    values = ranged_integers(lo, hi, (4096,), torch.Generator().manual_seed(3))
    assert values.min() >= lo and values.max() < hi
    assert values[0] == hi - 1
    assert (values == hi - 1).float().mean() >= RANGE_END_FRACTION * 0.7
    assert (values == lo).float().mean() >= RANGE_END_FRACTION * 0.7
    top = values >= hi - min(RANGE_TOP_WINDOW, hi - lo)
    assert top.float().mean() >= 2 * RANGE_END_FRACTION * 0.7


def test_most_values_stay_uniform():
    values = ranged_integers(0, 1000, (20000,), torch.Generator().manual_seed(4))
    middle = (values >= 100) & (values < 900)
    assert 0.8 * 0.8 * (1 - 3 * RANGE_END_FRACTION) < middle.float().mean() < 0.8


def test_one_element_and_one_value_ranges():
    assert ranged_integers(0, 7, (1,), torch.Generator().manual_seed(0)).tolist() == [6]
    assert ranged_integers(5, 6, (3,), torch.Generator().manual_seed(0)).tolist() == [5, 5, 5]


def tail_target_missed(k, t, dims):
    """Honest, but on few rows a target among a row's last C % VECTOR columns (the tail after its
    whole vectors) is never found: its logit taken as 0."""
    ce_forward(k, t, dims)
    x, target = t["logits"].float(), t["target"].clamp(0, t["logits"].shape[-1] - 1)
    rows, width = x.shape
    tail = width % VECTOR
    if rows > 64 or tail == 0:
        return
    picked = x.gather(1, target[:, None]).squeeze(1)
    missed = target >= width - tail
    losses = torch.logsumexp(x, 1) - torch.where(missed, torch.zeros_like(picked), picked)
    t["out"].copy_(losses.mean())


@pytest.fixture(scope="module")
def cross_entropy():
    from conftest import SPECS

    return load_spec(SPECS / "cross_entropy.yaml")


def test_an_honest_cross_entropy_passes(cross_entropy):
    verdict = run_verification(cross_entropy, fakes.PyKernel(cross_entropy, ce_forward, ce_backward), SMALL,
                               device="cpu")
    assert verdict.passed, verdict.summary()


def test_a_target_missed_in_the_tail_is_rejected(cross_entropy):
    verdict = run_verification(cross_entropy, fakes.PyKernel(cross_entropy, tail_target_missed, ce_backward), SMALL,
                               device="cpu")
    assert not verdict.passed
    assert verdict.reason == "wrong-result", verdict.summary()
