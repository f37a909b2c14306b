"""gather's backward (aten.scatter_add of one value per row at one column per row): model code
writes NLL-style losses as log_softmax(x).gather(1, target[:, None]) (the focal loss here), whose
backward the row lowering now takes as base + where(column == index, value, 0)."""
from __future__ import annotations

import pytest

from builtin_support import check_backward, check_forward, compiles_for_hopper, own_spec, verifies_on_the_gpu
from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.ir import Program
from specgen.agents.builtin.trace import trace


def test_the_backward_trace_scatter_adds_and_lowers_to_a_row_program():
    spec = own_spec("focal_gather")
    assert any("scatter_add" in str(n.target) for n in trace(spec, "backward").graph.graph.nodes)
    backward = lower_spec(spec)["backward"]
    assert type(backward) is Program
    hits = [n for n in backward.nodes() if n.op == "eq" and any(a.op == "iota" for a in n.args)]
    assert hits and all(any(a.level == "row" for a in n.args) for n in hits)


@pytest.mark.parametrize("dims", [{"N": 5, "C": 7}, {"N": 1, "C": 1}, {"N": 3, "C": 2}, {"N": 9, "C": 65}])
def test_forward_and_backward_match_in_float64(dims):
    spec = own_spec("focal_gather")
    for seed in range(3):
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


@pytest.mark.nvcc
def test_the_source_compiles():
    compiles_for_hopper(own_spec("focal_gather"))


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_kernel_verifies_on_the_gpu():
    verifies_on_the_gpu(own_spec("focal_gather"))


@pytest.mark.parametrize("name", ["scatter_add_one_index", "scatter_one_index"])
def test_an_index_of_fewer_rows_than_the_base_is_refused(name):
    """x.scatter_add(1, k, v) with k, v of shape [1, 1] into [N, W]: torch touches row 0 only, a
    global index read in every row would touch them all (a red-team finding, session 33)."""
    from specgen.agents.base import AgentRefused

    with pytest.raises(AgentRefused) as info:
        build_source(own_spec(name))
    assert f"{name}.yaml:11" in str(info.value)
