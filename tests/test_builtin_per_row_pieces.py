"""Per-row values in pieces along a row dim, and lower-rank inputs broadcast in steps: a [B, 2C]
conditioning vector read as two per-row halves (FiLM), per-row statistics concatenated into
[B, 2C] (a statistics pool) with the gradient read back in halves, and a [B] lengths input
compared against the columns before it is placed over [B, C, T]; checked by the CPU interpreter
against the reference and autograd; nvcc compiles; (GPU) verifies."""
from __future__ import annotations

import pytest

from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec

CASES = {"film_per_row_pieces": {"B": 3, "C": 4, "T": 9}, "mean_logvar_pool": {"B": 3, "C": 4, "T": 9},
         "length_masked_softmax_pool": {"B": 3, "C": 4, "T": 9}}


@pytest.mark.parametrize("name", list(CASES))
def test_the_lowering_matches_the_reference(name):
    check_forward(own_spec(name), CASES[name])


@pytest.mark.parametrize("name", list(CASES))
def test_the_backward_matches_autograd(name):
    check_backward(own_spec(name), CASES[name])


def _loads(program) -> set:
    return {(n.attrs["field"], n.attrs["kind"], n.attrs.get("rows_piece")) for n in program.nodes() if n.op == "load"}


def test_a_conditioning_vector_is_two_per_row_loads_and_its_gradient_two_row_stores():
    programs = lower_spec(own_spec("film_per_row_pieces"))
    assert [str(d) for d in programs["forward"].row_dims] == ["B", "C"]
    assert {("film", "row", (1, 0, 2)), ("film", "row", (1, 1, 2))} <= _loads(programs["forward"])
    stores = sorted((s.kind, s.piece) for s in programs["backward"].stores if s.field == "grad_film")
    assert stores == [("row", (1, 0, 2)), ("row", (1, 1, 2))]


def test_a_concatenation_of_per_row_statistics_is_a_row_store_per_piece():
    programs = lower_spec(own_spec("mean_logvar_pool"))
    assert sorted((s.kind, s.piece) for s in programs["forward"].stores) == [("row", (1, 0, 2)), ("row", (1, 1, 2))]
    assert {("grad_out", "row", (1, 0, 2)), ("grad_out", "row", (1, 1, 2))} <= _loads(programs["backward"])


def test_a_lengths_input_is_read_once_per_sequence_by_the_row_kernel():
    """lengths[:, None] against arange(T)[None, :] stays pending until unsqueeze(1) places it over
    [B, C, T]: a row load spanning the C rows of each sequence, with the column index beside it."""
    forward = lower_spec(own_spec("length_masked_softmax_pool"))["forward"]
    assert type(forward).__name__ == "Program"  # the row family, not the axis family's fallback
    lengths = [n for n in forward.nodes() if n.op == "load" and n.attrs["field"] == "lengths"]
    assert lengths and all(n.level == "row" and [str(d) for d in n.attrs["row_div"]] == ["C"] for n in lengths)


def test_per_row_pieces_of_a_width_that_only_matches_by_example_are_refused(tmp_path):
    """An output [B, C + 7] is not two pieces of C, though the traced example (C = 7) makes it 2C."""
    from specgen.spec import load_spec

    text = own_spec("mean_logvar_pool").path.read_text().replace("-> Tensor[B, 2*C]", "-> Tensor[B, C+7]")
    path = tmp_path / "mean_logvar_pool.yaml"
    path.write_text(text)
    spec = load_spec(path)
    from specgen.agents.builtin.trace import trace

    assert trace(spec, "forward").dims["C"] == 7  # the coincidence this test is about
    with pytest.raises(AgentRefused) as info:
        build_source(spec)
    assert str(info.value).startswith(str(path)) and "not n pieces of the row space" in str(info.value)


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(list(CASES))
