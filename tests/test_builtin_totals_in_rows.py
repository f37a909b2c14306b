"""A sum over every axis of element values in a program the row family must take anyway: DyT's
backward (held-out problems-v8, session 36) writes grad_x per element, the [D] weight's and bias's
gradients as sums over the rows, and its scalar alpha's gradient as a sum over every element. The
row family routes such a total to the axis family (which splits the elements over many blocks),
which cannot take the rest: refused. The retry (generator._row_programs(totals_in_rows=True)) takes
it as row sums then their sum, where the families refuse; a [1]-shaped output of a total is a
global store, like a 0-d one.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from builtin_support import check_backward, check_forward, compiles_for_hopper, own_spec, verifies_on_the_gpu

from specgen.agents.builtin.families.axis_reduce import AxisProgram
from specgen.agents.builtin.generator import lower_spec
from specgen.spec import load_spec

REDUCE_SPECS = Path(__file__).resolve().parent / "reduce_specs"


def test_the_scalar_gains_gradient_is_a_total_beside_the_column_sums():
    programs = lower_spec(own_spec("scalar_gain_tanh_affine"))
    assert not any(isinstance(p, AxisProgram) for p in programs.values())
    stores = {s.field: s for s in programs["backward"].stores}
    assert {f: s.kind for f, s in stores.items()} == {"grad_x": "elem", "grad_alpha": "global",
                                                      "grad_weight": "col", "grad_bias": "col"}
    total = stores["grad_alpha"].value
    assert total.op == "globalreduce" and total.args[0].op == "rowreduce"  # row sums, then their sum


def test_a_total_of_elements_alone_stays_with_the_axis_family():
    """An MSE's mean over every element: the axis family's (its first choice), not the retry's."""
    assert all(isinstance(p, AxisProgram) for p in lower_spec(load_spec(REDUCE_SPECS / "mse_loss.yaml")).values())


def test_the_lowered_programs_match_the_reference_on_the_cpu():
    spec = own_spec("scalar_gain_tanh_affine")
    for dims in ({"B": 2, "S": 3, "D": 37}, {"B": 1, "S": 1, "D": 1}):
        check_forward(spec, dims)
        check_backward(spec, dims)


@pytest.mark.nvcc
def test_the_kernels_compile_for_hopper():
    compiles_for_hopper(own_spec("scalar_gain_tanh_affine"))


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_kernels_verify_on_the_gpu():
    verifies_on_the_gpu(own_spec("scalar_gain_tanh_affine"))
