"""torch.arange along a row dim: a causal mask's query positions (arange(Q)[:, None] + K - Q against
arange(K)[None, :], broadcast over [B, H, Q, K]). The lowering refused every arange not along the
columns; it now stays pending until a broadcast places it (families/broadcast.py IotaRef): the
column index there, or a row's index along that row dim (`rowiota`, row level: (row / span) % size).
CPU: the IR and the interpreter against the reference; nvcc; GPU: the verifier.
"""
from __future__ import annotations

import pytest
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec

from specgen.agents.builtin.generator import lower_spec


def test_the_query_positions_are_a_row_value_and_the_key_positions_the_column():
    for direction, program in lower_spec(own_spec("causal_softmax")).items():
        nodes = program.nodes()
        rows = [n for n in nodes if n.op == "rowiota"]
        assert rows and all(n.level == "row" and n.attrs["axis"] == 2 for n in rows), direction  # Q of (B, H, Q)
        assert any(n.op == "iota" and n.level == "elem" for n in nodes), direction


@pytest.mark.parametrize("dims", [{"B": 2, "H": 3, "Q": 5, "K": 7}, {"B": 1, "H": 2, "Q": 6, "K": 6},
                                  {"B": 1, "H": 1, "Q": 1, "K": 1}])
def test_the_lowered_programs_match_the_reference_on_the_cpu(dims):
    spec = own_spec("causal_softmax")
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_the_interpreter_gives_each_row_its_index_along_the_axis():
    import torch

    from specgen.agents.builtin.interp import run_program
    from specgen.agents.builtin.ir import Node, Program, Store
    from specgen.signature import Dim

    rows = (Dim("A"), Dim("B"), Dim("C"))
    for axis, expected in ((0, lambda a, b, c: a), (1, lambda a, b, c: b), (2, lambda a, b, c: c)):
        pos = Node("rowiota", (), "row", "int", {"axis": axis}, "p")
        program = Program("op", "forward", rows, Node("dim", (), "const", "int", {"dim": Dim("W")}, "w"), 1,
                          [Store("out", Node("cast", (pos,), "row", "float", {}, "f"), "row", None)], None, {}, 1)
        out = {"out": torch.full((2, 3, 4), float("nan"), dtype=torch.float64)}
        run_program(program, {}, {}, {"A": 2, "B": 3, "C": 4, "W": 1}, out)
        want = torch.tensor([[[expected(a, b, c) for c in range(4)] for b in range(3)] for a in range(2)])
        assert torch.equal(out["out"], want.double()), axis


def test_a_position_vector_viewed_as_1_s_1_is_the_rows_index_along_s():
    """positions.view(1, -1, 1): a reshape that only adds size-1 dims moves the pending arange too."""
    spec = own_spec("position_tempered_softmax")
    for direction, program in lower_spec(spec).items():
        assert [n.attrs["axis"] for n in program.nodes() if n.op == "rowiota"] == [1], direction
    for dims in ({"B": 2, "S": 5, "D": 7}, {"B": 1, "S": 1, "D": 1}):
        check_forward(spec, dims)
        check_backward(spec, dims)


OPS = ["causal_softmax", "position_tempered_softmax"]


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)


def test_an_arange_reduced_before_any_broadcast_is_refused_not_read_as_the_columns():
    """arange(Q).mean() materializes at its own shape [Q], right-aligned onto the column axis (of
    K): the column index counts K columns, so the program took the mean of 0..K-1. The pending
    arange's length is now held to the axis it lands on (a review of session 36)."""
    from specgen.agents.base import AgentRefused

    spec = own_spec("row_arange_reduced_alone")
    with pytest.raises(AgentRefused) as info:
        lower_spec(spec)
    assert "row_arange_reduced_alone.yaml" in str(info.value) and "two widths" in str(info.value)
