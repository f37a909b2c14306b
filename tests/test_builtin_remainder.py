"""Python's modulo and floor division in a reference: `torch.remainder` (prims.remainder, the
divisor's sign) as an op of the one table (ops.OPS, emit.op_expr by dtype), `prims.signbit` (torch's
floor division of integers), and a size given to torch.div as a tensor (prims.scalar_tensor of a
size: a dim node, not a constant). Before, a beam search's flat index split by a vocabulary size
was refused on prims.signbit, then on prims.remainder (held-out problems-v11, CPU first contact,
session 40). CPU: the IR and the interpreter; nvcc; GPU: the verifier."""
from __future__ import annotations

import pytest
import torch
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec

from specgen.agents.builtin.families.axis_reduce import run_axis_program
from specgen.agents.builtin.generator import lower_spec
from specgen.inputs import make_inputs
from specgen.spec import load_spec
from test_axis_reduce import SPECS


@pytest.mark.parametrize("dims", [{"N": 3, "D": 5}, {"N": 2, "D": 64}, {"N": 1, "D": 1}])
def test_a_wrapped_phase_matches_the_reference(dims):
    spec = own_spec("phase_wrap")
    assert "remainder" in {n.op for n in lower_spec(spec)["forward"].nodes()}
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_remainder_takes_the_divisors_sign_on_negative_values():
    """-0.5 wraps to 1.5 (C's fmod gives -0.5): the interpreter runs the op's own table entry."""
    spec = own_spec("phase_wrap")
    x = torch.tensor([[-0.5, -2.25, 0.75, -1e-9]], dtype=torch.float64)
    out = {"out": torch.full_like(x, float("nan"))}
    from specgen.agents.builtin.interp import run_program

    run_program(lower_spec(spec)["forward"], {"x": x}, {}, {"N": 1, "D": 4}, out)
    torch.testing.assert_close(out["out"], spec.reference_fn()(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dims", [{"B": 3, "K": 4, "V": 7}, {"B": 1, "K": 1, "V": 1}, {"B": 2, "K": 5, "V": 1}])
def test_a_flat_index_splits_into_row_and_column(dims):
    spec = load_spec(SPECS / "flat_argmax_divmod.yaml")
    program = lower_spec(spec)["forward"]
    assert {"remainder", "signbit"} <= {n.op for n in program.nodes()}
    assert not [n for n in program.nodes() if n.op == "const" and not isinstance(n.attrs["value"], (int, float))]
    args = make_inputs(spec.signature, dims, "float64", seed=5)
    outs = {"best": torch.empty(dims["B"], dtype=torch.float64), "row": torch.empty(dims["B"], dtype=torch.int64),
            "col": torch.empty(dims["B"], dtype=torch.int64)}
    run_axis_program(program, {"x": args["x"]}, {}, dims, outs)
    best, row, col = spec.reference_fn()(args["x"])
    assert torch.equal(outs["row"], row) and torch.equal(outs["col"], col)
    torch.testing.assert_close(outs["best"], best, rtol=0, atol=0)


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(["phase_wrap"])
