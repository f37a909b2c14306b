"""A pointwise forward with per-channel parameters whose backward reduces (PReLU's slope, a
channel scale and shift over [N, C, H, W]): the forward has no reduction to place the axis
family's layout, so the backward's reductions place it (the kept channels, both ends reduced).
The forward is then the family's flat elem pass reading each channel's parameters; the
backward sums the parameters' gradients over N and the spatial axes. Specs that ask no backward
kernel stay with the flat pointwise family."""
from __future__ import annotations

import pytest
import torch

from builtin_support import check_backward, check_forward, own_spec
from specgen.agents.builtin import build_source
from specgen.agents.builtin.families.axis_reduce import AxisProgram, run_axis_program
from specgen.agents.builtin.generator import lower_spec
from specgen.inputs import make_inputs

CASES = {
    "channel_scale_shift": [{"N": 2, "C": 3, "H": 5, "W": 7}, {"N": 1, "C": 1, "H": 1, "W": 1},
                            {"N": 3, "C": 4, "H": 1, "W": 2}],
    "prelu_channels": [{"N": 2, "C": 3, "L": 5}, {"N": 1, "C": 1, "L": 1}, {"N": 4, "C": 2, "L": 33}],
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_backward_places_the_layout_on_the_channels(name):
    programs = lower_spec(own_spec(name))
    assert set(programs) == {"forward", "backward"}
    assert all(isinstance(p, AxisProgram) for p in programs.values())
    layout = programs["forward"].layout
    assert layout.ends and [str(d) for d in layout.block] == ["C"]
    assert not any(n.op in ("rowreduce", "globalreduce") for n in programs["forward"].nodes())
    assert any(n.op == "rowreduce" for n in programs["backward"].nodes())


@pytest.mark.parametrize("name, dims", [(n, d) for n, ds in CASES.items() for d in ds])
def test_forward_and_backward_match_the_reference_in_float64(name, dims):
    spec = own_spec(name)
    for seed in range(3):
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 1e-2)])
def test_the_forward_in_the_specs_dtypes(name, dtype, tol):
    spec = own_spec(name)
    dims = CASES[name][0]
    args = make_inputs(spec.signature, dims, dtype, seed=5)
    out = {"out": torch.full(tuple(args["x"].shape), float("nan"), dtype=torch.float64)}
    run_axis_program(lower_spec(spec)["forward"], dict(args), {}, dims, out, acc=torch.float32)
    torch.testing.assert_close(out["out"], spec.reference_fn()(**args).double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dims", [{"N": 2, "D": 3}, {"N": 1, "D": 1}, {"N": 3, "D": 1}, {"N": 1, "D": 4}])
def test_a_one_element_input_added_to_every_row(dims):
    """t [1] expanded over the columns: the backward's total over every element places the
    layout; the interpreter reads the [1] input as one value (it reshaped it to the kept count
    and crashed before: a red-team finding, session 33)."""
    spec = own_spec("one_value_expand_cols")
    assert all(isinstance(p, AxisProgram) for p in lower_spec(spec).values())
    for seed in range(3):
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


def test_a_pointwise_spec_without_a_backward_kernel_stays_flat():
    programs = lower_spec(own_spec("channel_affine"))  # backward: reference
    assert set(programs) == {"forward"} and not isinstance(programs["forward"], AxisProgram)


@pytest.mark.nvcc
@pytest.mark.parametrize("name", [*CASES, "one_value_expand_cols"])
def test_the_sources_compile(name):
    from specgen.agents.builtin.generator import compile_source

    spec = own_spec(name)
    compile_source(spec, build_source(spec), arch="sm_90")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", [*CASES, "one_value_expand_cols"])
def test_the_kernels_verify_on_the_gpu(name):
    from specgen.verify import verify_kernel

    spec = own_spec(name)
    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()
