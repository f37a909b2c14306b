"""Row pieces: an input read as n equal pieces along a row dim (torch.chunk over channels, F.glu
with dim=1) and its gradient written back piece by piece, with the output's rows as the row space;
checked by the CPU interpreter against the reference and autograd; nvcc compiles; (GPU) verifies."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from builtin_support import check_backward, check_forward, own_spec, verifies_on_the_gpu
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import rows_piece_index
from specgen.signature import Dim

CASES = {"glu_channels": {"B": 2, "C": 3, "T": 5}, "chunk3_gate_rows": {"B": 2, "C": 3, "H": 4, "W": 5}}


@pytest.mark.parametrize("name", list(CASES))
def test_row_pieces_match_the_reference(name):
    check_forward(own_spec(name), CASES[name])


@pytest.mark.parametrize("name", list(CASES))
def test_row_pieces_backward_matches_autograd(name):
    check_backward(own_spec(name), CASES[name])


@pytest.mark.parametrize("name, n", [("glu_channels", 2), ("chunk3_gate_rows", 3)])
def test_each_piece_is_a_load_and_its_gradient_a_store_of_its_own(name, n):
    programs = lower_spec(own_spec(name))
    forward, backward = programs["forward"], programs["backward"]
    assert [str(d) for d in forward.row_dims][:2] == ["B", "C"]  # the output's rows, not [B, n*C]
    pieces = {n_.attrs["rows_piece"] for n_ in forward.nodes() if n_.op == "load" and n_.attrs.get("rows_piece")}
    assert pieces == {(1, k, n) for k in range(n)}
    assert sorted(s.piece for s in backward.stores if s.field == "grad_x") == [(1, k, n) for k in range(n)]


@pytest.mark.parametrize("shape, n", [((2, 6, 5), 2), ((3, 9, 4, 2), 3), ((1, 4, 7), 4)])
def test_the_row_of_a_piece_is_where_torch_chunk_reads_it(shape, n):
    """rows_piece_index (its C twin is ctext.rows_piece_index) against torch.chunk's own views."""
    x = torch.arange(torch.Size(shape).numel()).reshape(shape)
    dims = {f"d{i}": (s // n if i == 1 else s) for i, s in enumerate(shape[:-1])}
    program = SimpleNamespace(row_dims=[Dim(f"d{i}") for i in range(len(shape) - 1)])  # the piece's rows
    rows = math.prod(dims.values())
    flat = x.reshape(-1, shape[-1])
    for k, piece in enumerate(x.chunk(n, dim=1)):
        assert torch.equal(flat[rows_piece_index(program, rows, dims, (1, k, n))], piece.reshape(-1, shape[-1]))


def test_slices_that_are_not_equal_pieces_are_refused():
    with pytest.raises(AgentRefused) as info:
        build_source(own_spec("channel_shifted_product"))
    assert "strided view" in str(info.value)


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_row_piece_sources_compile(name):
    from specgen.agents.builtin.generator import compile_source

    spec = own_spec(name)
    compiled = compile_source(spec, build_source(spec))
    assert any("_rows<" in k for k in compiled.resources)


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_row_piece_kernels_verify_on_the_gpu(name):
    verifies_on_the_gpu(own_spec(name))
