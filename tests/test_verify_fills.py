"""The two pre-fills of the unwritten-output check: random bytes, and different in every element,
so a written value (the same in both runs) can never be taken for a kept fill."""
import torch

from specgen.verify.compare import bits, unwritten
from specgen.verify.runner import differ_from, fill_outputs


class StandInRunner:
    def __init__(self, tensors: dict):
        self.tensors = tensors

    def tensor(self, ref):
        return self.tensors[ref]


def test_second_fill_differs_from_the_first_in_every_element():
    out = torch.empty(1 << 18, dtype=torch.bfloat16)
    runner = StandInRunner({"y": out})
    fill_outputs(runner, {"y": "y"}, 0)
    fill_outputs(runner, {"y": "y"}, 1)
    first, second = runner.fills[0]["y"], runner.fills[1]["y"]
    assert bool((bits(first) != bits(second)).all())
    assert bool((bits(out) == bits(second)).all())  # the output holds the recorded second fill


def test_a_written_value_equal_to_both_random_fills_is_no_longer_possible():
    # independent fills can agree at an element; a kernel that writes that value there was
    # reported unwritten (held-out v4, session 21: 1 of 10^9 bf16 elements)
    first = torch.tensor([1.5, 2.0, -3.0], dtype=torch.bfloat16)
    second = torch.tensor([1.5, 7.0, -3.0], dtype=torch.bfloat16)
    written = torch.tensor([1.5, 0.25, 4.0], dtype=torch.bfloat16)
    assert bool(unwritten(written, written, first, second)[0])  # the old false positive
    differ_from(second, first)
    assert not bool(unwritten(written, written, first, second).any())
    # an element really left unwritten still shows
    kept_a, kept_b = written.clone(), written.clone()
    kept_a[1], kept_b[1] = first[1], second[1]
    assert unwritten(kept_a, kept_b, first, second).tolist() == [False, True, False]


def test_differ_from_leaves_unrelated_tensors_alone():
    second = torch.tensor([1.0, 2.0], dtype=torch.float16)
    before = bits(second).clone()
    differ_from(second, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16))  # another shape: not a pair
    differ_from(second, None)
    assert torch.equal(bits(second), before)
