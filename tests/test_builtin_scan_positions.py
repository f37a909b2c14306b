"""A scan program that reads element positions (a running mean: a cumulative sum divided by the
count of steps so far, built with torch.arange): the scan kernels give each element its index
along every axis from its flat index e (the column e % W, row dim k's (e / W / span) % size).
The family refused any per-row value before ("a scan fused with ... per-row values"; held-out
problems-v8, read after its first contact). CPU: the programs against the reference; the kernels'
text; nvcc; GPU: the verifier (the lanes kernel along T, the tiles kernel along the last axis)."""
from __future__ import annotations

import pytest
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec

from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.families.scan import plan_of
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.ir import Node, Program, Store
from specgen.signature import Dim

OPS = ["running_mean_time_axis", "running_mean_last_axis"]


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dims", [{"B": 2, "T": 5, "D": 3, "N": 3, "L": 7}, {"B": 1, "T": 1, "D": 1, "N": 1, "L": 1}])
def test_the_programs_match_the_reference(name, dims):
    spec = own_spec(name)
    dims = {k: v for k, v in dims.items() if k in spec.dims}
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_each_element_reads_its_position_from_its_flat_index():
    along_t = build_source(own_spec("running_mean_time_axis"))
    assert "(e / W / (1)) % ((int64_t)(A.T))" in along_t  # T: the last row dim, span 1
    along_l = build_source(own_spec("running_mean_last_axis"))
    assert "(e % W)" in along_l


def test_a_per_row_value_read_from_memory_is_still_refused():
    """Positions are computed; a row load (one value per row from an input) is not a position."""
    rows = [Dim("N")]
    x = Node("load", (), "elem", "float", {"field": "x", "kind": "elem", "row_div": [], "offset": None}, "x")
    per_row = Node("load", (), "row", "float", {"field": "s", "kind": "row", "row_div": []}, "s")
    scan = Node("scan", (x,), "elem", "float", {"kind": "sum", "axis": 1, "shape": (3, 5), "reverse": False}, "c")
    out = Node("div", (scan, per_row), "elem", "float", {}, "o")
    program = Program("op", "forward", rows, Node("dim", (), "global", "int", {"dim": Dim("L")}, "w"), 5,
                      [Store("out", out, "elem")])
    with pytest.raises(AgentRefused, match="per-row values"):
        plan_of(program)
    assert all(lower_spec(own_spec(name)) for name in OPS)


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)
