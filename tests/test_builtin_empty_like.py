"""torch's decompositions allocate with empty_like (traced as aten.empty_permuted) and fill the
tensor before reading it (F.cosine_embedding_loss): an uninitialized value to the lowering, as
empty and empty_strided are, not a refused op."""
from __future__ import annotations

import pytest

from builtin_support import check_backward, check_forward, compiles_for_hopper, own_spec, verifies_on_the_gpu
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.ir import Program
from specgen.agents.builtin.trace import trace


def test_the_trace_allocates_with_empty_permuted_and_the_row_lowering_takes_it():
    spec = own_spec("cosine_pairs_margin")
    targets = {str(n.target) for d in ("forward", "backward") for n in trace(spec, d).graph.graph.nodes}
    assert any("empty_permuted" in t for t in targets)
    assert all(type(p) is Program for p in lower_spec(spec).values())


@pytest.mark.parametrize("dims", [{"N": 5, "D": 7}, {"N": 1, "D": 1}, {"N": 3, "D": 2}])
def test_forward_and_backward_match_in_float64(dims):
    spec = own_spec("cosine_pairs_margin")
    for seed in range(3):
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


@pytest.mark.nvcc
def test_the_source_compiles():
    compiles_for_hopper(own_spec("cosine_pairs_margin"))


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_kernel_verifies_on_the_gpu():
    verifies_on_the_gpu(own_spec("cosine_pairs_margin"))
