"""torch.var_mean's mean as torch's Welford update gives it (specgen/agents/builtin/welford.py):
NaN for a group holding an infinity, the infinity itself for a group of one element; the lowered
program, run by the CPU interpreter, against eager torch."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from builtin_support import check_backward
from specgen.agents.builtin.families.axis_reduce import AxisProgram, run_axis_program
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import run_program
from specgen.spec import load_spec

SPEC = Path(__file__).resolve().parent.parent / "benchmarks" / "level1" / "specs" / "var_mean_dims02.yaml"


def run_forward(spec, x: torch.Tensor) -> dict[str, torch.Tensor]:
    dims = dict(zip(("B", "C", "S"), x.shape))
    program = lower_spec(spec)["forward"]
    outs = {o.name: torch.full(o.type.shape(dims), 7.0, dtype=torch.float64) for o in spec.signature.outputs}
    (run_axis_program if isinstance(program, AxisProgram) else run_program)(program, {"x": x}, {}, dims, outs)
    return outs


@pytest.mark.parametrize("shape", [(3, 4, 5), (1, 4, 1)])  # several elements per channel, and one
def test_a_channel_holding_an_infinity_has_the_mean_torch_gives(shape):
    spec = load_spec(SPEC)
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x[0, 1, 0] = -float("inf")  # channel 1: -inf among finite values (alone when the group is one element)
    x[:, 2, :] = float("inf")  # channel 2: all +inf
    want_var, want_mean = torch.var_mean(x, dim=(0, 2))
    got = run_forward(spec, x)
    torch.testing.assert_close(got["mean"], want_mean, equal_nan=True)
    torch.testing.assert_close(got["var"], want_var, equal_nan=True)
    assert bool(torch.isfinite(got["mean"][[0, 3]]).all())  # the other channels untouched
    if shape[0] * shape[2] > 1:
        assert torch.isnan(got["mean"][1]) and torch.isnan(want_mean[1])  # Welford: inf - inf
    else:
        assert got["mean"][1] == -float("inf") == want_mean[1]  # one element: the value itself


def test_finite_channels_keep_their_mean_and_gradient():
    check_backward(load_spec(SPEC), {"B": 3, "C": 4, "S": 6})
