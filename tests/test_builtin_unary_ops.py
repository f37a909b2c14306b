"""Unary ops the row lowering takes since session 46 (round, trunc, the trigonometric and
hyperbolic families): lowered, and equal to torch's on the CPU interpreter forward and backward."""
from __future__ import annotations

import pytest

from specgen.agents.builtin.cpu_check import check_backward, check_forward
from specgen.agents.builtin.generator import build_source, lower_spec
from specgen.spec import load_spec

OPS = {
    "tan": "torch.tan(x.clamp(-1.2, 1.2))", "atan": "torch.atan(x)", "asin": "torch.asin(x.clamp(-0.9, 0.9))",
    "acos": "torch.acos(x.clamp(-0.9, 0.9))", "sinh": "torch.sinh(x)", "cosh": "torch.cosh(x)",
    "asinh": "torch.asinh(x)", "acosh": "torch.acosh(1.5 + x * x)", "atanh": "torch.atanh(x.clamp(-0.9, 0.9))",
    # straight-through: the rounding's own gradient is zero, the identity's carries
    "round": "x + (torch.round(x * 4) / 4 - x).detach() + torch.round(x)",
    "trunc": "x * torch.trunc(x * 3)",
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_a_unary_op_lowers_and_matches_torch(op, tmp_path):
    path = tmp_path / f"u_{op}.yaml"
    path.write_text(f'name: u_{op}\ndescription: {op} (a unary-op test spec)\n'
                    f'signature: "u_{op}(x: Tensor[N, D]) -> Tensor[N, D]"\ndtypes: [float32]\n'
                    f'dims: {{N: [1, 64], D: [1, 64]}}\nreference: |\n  import torch\n\n  def reference(x):\n'
                    f'      return {OPS[op]}\nbackward: kernel\n')
    spec = load_spec(path)
    programs = lower_spec(spec)
    assert any(n.op == op for n in programs["forward"].nodes())
    for dims in ({"N": 3, "D": 17}, {"N": 1, "D": 1}):
        check_forward(spec, dims)
        check_backward(spec, dims)
    assert f"{'rint' if op == 'round' else op}((acc_t)" in build_source(spec)
