"""log10 and log2 of elements (a power in decibels, bits), and log1p of a float scalar computed in
Python by the reference (logarithmic companding's normalizer): ops of the one op table
(ops.OPS) and a form of scalar_constants.FORMS. Before, `prims.log10` was refused and the number
log1p(alpha) was refused as a constant computed from a scalar (held-out problems-v10, CPU first
contact, session 39). CPU: the IR and the interpreter; nvcc; GPU: the verifier."""
from __future__ import annotations

import pytest
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec

from specgen.agents.builtin.generator import lower_spec

OPS = ["power_db_bits", "log1p_compand"]


def _ops(program) -> set[str]:
    return {n.op for n in program.nodes()}


def test_log10_and_log2_are_ops_of_the_program():
    forward = lower_spec(own_spec("power_db_bits"))["forward"]
    assert {"log10", "log2"} <= _ops(forward)


def test_the_normalizer_is_log1p_of_the_scalar_not_a_baked_number():
    for direction, program in lower_spec(own_spec("log1p_compand")).items():
        scalar_log1p = [n for n in program.nodes() if n.op == "log1p" and any(a.op == "scalar" for a in n.args)]
        assert scalar_log1p, direction


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dims", [{"N": 3, "D": 5}, {"N": 2, "D": 64}, {"N": 1, "D": 1}])
def test_the_lowered_programs_match_the_reference(name, dims):
    spec = own_spec(name)
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_another_alpha_gives_another_answer():
    """The scalar is read at run time: the interpreter at alpha = 7 matches the reference at 7."""
    import torch

    from specgen.agents.builtin.interp import run_program
    from specgen.inputs import make_inputs

    spec = own_spec("log1p_compand")
    dims = {"N": 2, "D": 9}
    args = make_inputs(spec.signature, dims, "float64", seed=2)
    args["alpha"] = 7.0
    out = {"out": torch.full((2, 9), float("nan"), dtype=torch.float64)}
    run_program(lower_spec(spec)["forward"], {"x": args["x"]}, {"alpha": 7.0}, dims, out)
    torch.testing.assert_close(out["out"], spec.reference_fn()(args["x"], 7.0).double(), rtol=1e-12, atol=1e-12)


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)
