"""A per-sample tensor broadcast over trailing row dims and the columns ([B] read as [B, 1, 1] over rows
[B, S] of D columns) in a program with row reductions: a row value spanning S rows
(optimize.row_broadcasts), where the lowering's `bcast` load (each element at its coordinates) is
the flat family's alone. Held-out problems-v8's log-softmax masked by per-sample key lengths was
refused for it (session 36). CPU: the IR and the interpreter against the reference; nvcc; GPU: the
verifier.
"""
from __future__ import annotations

import pytest
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec

from specgen.agents.builtin.generator import lower_spec

OPS = ["per_sample_scaled_softmax", "length_masked_log_softmax"]


def _loads(program, field):
    return [n for n in program.nodes() if n.op == "load" and n.attrs["field"] == field]


@pytest.mark.parametrize("name,field,span", [("per_sample_scaled_softmax", "scale", "S"),
                                             ("length_masked_log_softmax", "lengths", "H")])
def test_a_per_sample_value_is_a_row_load_spanning_the_trailing_rows(name, field, span):
    for direction, program in lower_spec(own_spec(name)).items():
        loads = _loads(program, field)
        assert loads, direction
        for n in loads:
            assert (n.level, n.attrs["kind"]) == ("row", "row"), direction
            assert [str(d) for d in n.attrs["row_div"]] == [span], direction


@pytest.mark.parametrize("name", OPS)
def test_the_lowered_programs_match_the_reference_on_the_cpu(name):
    spec = own_spec(name)
    for dims in ({"B": 3, "S": 5, "H": 5, "D": 37, "K": 37}, {"B": 1, "S": 1, "H": 1, "D": 1, "K": 1}):
        dims = {s: v for s, v in dims.items() if s in spec.signature.symbols()}
        check_forward(spec, dims)
        check_backward(spec, dims)


def test_a_scan_keeps_its_broadcast_load():
    """The scan family reads `bcast` loads itself: the pass leaves programs with scans alone."""
    from specgen.agents.builtin.ir import Node, Program
    from specgen.agents.builtin.optimize import row_broadcasts
    from specgen.signature import Dim

    x = Node("load", (), "elem", "float", {"field": "x", "kind": "elem", "row_div": [], "offset": None}, "x")
    b = Node("load", (), "elem", "float", {"field": "s", "kind": "bcast", "row_div": [], "offset": None,
                                           "present": (True, False, False)}, "s")
    total = Node("rowreduce", (Node("mul", (x, b), "elem", "float", {}, "m"),), "row", "float", {"kind": "sum"}, "t")
    rows = (Dim("B"), Dim("S"))
    from specgen.agents.builtin.ir import Store

    plain = Program("op", "forward", rows, Node("dim", (), "const", "int", {"dim": Dim("D")}, "w"), 4,
                    [Store("out", total, "row", None)], None, {}, 1)
    assert [n.attrs["kind"] for n in row_broadcasts(plain).nodes() if n.op == "load"].count("row") == 1
    scan = Node("scan", (x,), "elem", "float", {"kind": "sum", "axis": 1, "reverse": False}, "c")
    with_scan = Program("op", "forward", rows, plain.width, 4,
                        [Store("out", total, "row", None), Store("c", scan, "elem", None)], None, {}, 1)
    assert "bcast" in [n.attrs["kind"] for n in row_broadcasts(with_scan).nodes() if n.op == "load"]


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)
