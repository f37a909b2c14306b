"""torch.arange along the columns (prims.iota): the column index, so a length mask
(arange(W) < length[:, None], mean pooling over padded sequences) or a one-hot by comparison
lowers; an arange along the rows is refused with its reason."""
from __future__ import annotations

import pytest

from builtin_support import check_backward, check_forward, compiles_for_hopper, own_spec, verifies_on_the_gpu
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.lower import lower
from specgen.agents.builtin.trace import trace


def test_the_mask_compares_the_column_index_with_a_row_value():
    program = lower_spec(own_spec("length_masked_mean"))["forward"]
    compares = [n for n in program.nodes() if n.op == "lt"]
    assert any({a.op for a in n.args} >= {"iota"} and any(a.level == "row" for a in n.args) for n in compares)


@pytest.mark.parametrize("dims", [{"N": 5, "W": 7}, {"N": 1, "W": 1}, {"N": 3, "W": 2}])
def test_forward_and_backward_match_in_float64(dims):
    spec = own_spec("length_masked_mean")
    for seed in range(4):  # lengths of 0 (an empty row), of W, between
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


def test_an_arange_along_the_rows_is_the_rows_index():
    """Refused until session 36 (test_builtin_row_arange.py: the pending arange); now a row value."""
    spec = own_spec("arange_on_rows")
    program = lower(trace(spec, "forward"))
    assert [(n.level, n.attrs["axis"]) for n in program.nodes() if n.op == "rowiota"] == [("row", 0)]
    for dims in ({"N": 5, "W": 7}, {"N": 1, "W": 1}):
        check_forward(spec, dims)


@pytest.mark.nvcc
def test_the_source_compiles():
    compiles_for_hopper(own_spec("length_masked_mean"))


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_kernel_verifies_on_the_gpu():
    verifies_on_the_gpu(own_spec("length_masked_mean"))


def test_the_axis_family_reads_an_arange_along_a_kept_axis_as_that_coordinate():
    """softmax over the channels of [B, C, L] times arange(L): the axis family's column is the
    channel axis, so the arange was read as the channel index once (a wrong program the
    interpreter showed, session 33) and then refused; since session 40 an arange over one atom of
    S is each element's coordinate along it (L's, a kept atom), and the program matches."""
    from specgen.agents.builtin.families.axis_reduce import lower_axis

    spec = own_spec("softmax_mid_ramp")
    forward = lower_axis(spec)["forward"]
    aranges = [n.attrs for n in forward.nodes() if n.op == "load" and n.attrs.get("arange")]
    assert [(a["atoms"], a["arange"]) for a in aranges] == [((2,), (0, 1))]  # L, not C (atom 1)
    for dims in ({"B": 2, "C": 5, "L": 7}, {"B": 1, "C": 1, "L": 1}, {"B": 3, "C": 7, "L": 5}):
        check_forward(spec, dims)
