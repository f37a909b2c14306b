"""The case past 2^31 elements is prepared lean (a float32 truth, no working-dtype reference) so it
fits the GPU. A backward that reads a 16-bit forward output inherits that output's rounding, as
the reference run in the working dtype does: on the H200 (session 32) an honest log_softmax
backward, grad - exp(out) x sum(grad), was 0.0018 off at 8 elements of a float16 case with
131072-wide rows (atol 1e-3) and was rejected. A lean case that fails now asks for the reference in
the working dtype and is widened by its own error, as every other case is."""
from __future__ import annotations

import pytest
import torch

from conftest import SPECS
from specgen.spec import load_spec
from specgen.verify import checks
from specgen.verify.data import prepare
from specgen.verify.strategies import Case
from specgen.verify.verdict import Failure

D = 4096
X0 = 3.3  # one large logit a row: the others' float16 log-probabilities round by ~0.27% (searched)


def lean_case_with_rounded_output():
    """A float16 log_softmax backward prepared lean, its inputs set to rows whose float16 `out`
    rounds where exp(out) x sum(grad) multiplies the rounding (output gradients of ones)."""
    spec = load_spec(SPECS / "log_softmax.yaml")
    data = prepare(spec, Case(dims=(("N", 2), ("D", D)), dtype="float16", seed=3), "backward", device="cpu",
                   later=True, lean=True)
    x = torch.zeros(2, D, dtype=torch.float16)
    x[:, 0] = X0
    data.inputs["x"].copy_(x)
    data.inputs["out"].copy_(torch.log_softmax(x.float(), dim=-1).half())
    data.inputs["grad_out"].copy_(torch.ones(2, D, dtype=torch.float16))
    return data


def honest_backward(data) -> torch.Tensor:
    """torch's formula on the values the kernel reads, in float32, stored in float16."""
    out, grad = data.inputs["out"].float(), data.inputs["grad_out"].float()
    return (grad - torch.exp(out) * grad.sum(-1, keepdim=True)).half()


def test_an_honest_backward_on_a_rounded_output_passes_the_lean_case():
    data = lean_case_with_rounded_output()
    assert data.lean
    checks.check_close(data, {"grad_x": honest_backward(data)})


def test_without_the_working_reference_it_is_rejected(monkeypatch):
    """The gap the widening closes: with no working-dtype reference (as before) the same honest
    result is wrong-result."""
    monkeypatch.setattr(checks, "working_reference_for_lean", lambda data: {})
    data = lean_case_with_rounded_output()
    with pytest.raises(Failure, match="grad_x"):
        checks.check_close(data, {"grad_x": honest_backward(data)})


def test_a_wrong_row_is_still_rejected_in_a_lean_case():
    """The lean case is there to catch a wrong row: the working reference widens by its own error only."""
    data = lean_case_with_rounded_output()
    got = honest_backward(data)
    got[1] = got[0].flip(0)  # the other row's values, reversed
    with pytest.raises(Failure, match="grad_x"):
        checks.check_close(data, {"grad_x": got})
    assert not data.lean  # the working reference was asked for once
