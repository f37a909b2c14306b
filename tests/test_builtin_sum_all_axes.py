"""One sum over the columns and the rows at once (`x.sum()` of a per-element value of a row
program, or `.sum(dim=(0, 1))`): lowered as the row sums, then a sum of those over the rows (a
`globalreduce` of a `rowreduce`), so the loss over every element of a softmax-family value is a
row program and not a refusal. The interpreter matches the reference in float64 and in the
spec's dtypes, and nvcc compiles the source."""
from __future__ import annotations

import pytest
import torch

from builtin_support import check_backward, check_forward, compiles_for_hopper, own_spec, verifies_on_the_gpu
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import run_program
from specgen.inputs import make_inputs

DIMS = [{"B": 2, "S": 3, "V": 37}, {"B": 1, "S": 1, "V": 5}, {"B": 4, "S": 1, "V": 1}]
TOL = {"float32": 2e-5, "bfloat16": 2e-2}


def test_the_forward_is_a_sum_over_rows_of_row_sums():
    program = lower_spec(own_spec("entropy_total"))["forward"]
    (store,) = program.stores
    assert store.kind == "global" and store.value.level == "post"
    totals = [n for n in program.nodes() if n.op == "globalreduce"]
    assert len(totals) == 1 and totals[0].args[0].level == "row"
    assert any(n.op == "rowreduce" and n.attrs["kind"] == "sum" for n in program.nodes())


@pytest.mark.parametrize("dims", DIMS)
def test_forward_and_backward_match_the_reference_in_float64(dims):
    spec = own_spec("entropy_total")
    check_forward(spec, dims)
    check_backward(spec, dims)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_forward_matches_in_the_specs_dtypes(dtype):
    spec = own_spec("entropy_total")
    dims = DIMS[0]
    args = make_inputs(spec.signature, dims, dtype, seed=13)
    outs = {"out": torch.full((), float("nan"), dtype=torch.float64)}
    run_program(lower_spec(spec)["forward"], {"x": args["x"]}, {}, dims, outs)
    want = spec.reference_fn()(**args)
    torch.testing.assert_close(outs["out"], want.double(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.nvcc
def test_the_source_compiles():
    compiles_for_hopper(own_spec("entropy_total"))


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_kernel_verifies_on_the_gpu():
    verifies_on_the_gpu(own_spec("entropy_total"))
