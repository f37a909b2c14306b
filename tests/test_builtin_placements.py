"""Wrong lowerings a red team found (session 42), each now refused or right: a slice that is a
piece only at the traced example sizes, one pending arange placed two ways, a scatter with
reduce=; checked on the CPU (the interpreter against the reference and autograd)."""
from __future__ import annotations

import pytest

from builtin_support import check_backward, check_forward, own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.trace import trace


@pytest.mark.parametrize("name, why", [
    ("narrow_at_a_piece_by_example", "strided view"),  # x.narrow(1, B + 2, C): piece 1 only where B + 2 = C
    ("narrow_per_row_piece_by_example", "not rows x columns"),  # the same of a [B, 2C] per-row vector
    ("scatter_reduce_add", "reduce='add'"),  # was lowered as a plain scatter (a put)
])
def test_it_is_refused_not_lowered_wrong(name, why):
    spec = own_spec(name)
    with pytest.raises(AgentRefused) as info:
        build_source(spec)
    assert why in str(info.value) and str(info.value).startswith(str(spec.path))


def test_the_slices_start_where_a_piece_starts_only_at_the_example():
    """The coincidence the two narrow specs are about: at the traced sizes B + 2 = C."""
    dims = trace(own_spec("narrow_at_a_piece_by_example"), "forward").dims
    assert dims["B"] + 2 == dims["C"]


def test_one_arange_placed_two_ways_is_the_row_index_against_the_column():
    spec = own_spec("causal_mask_one_arange")
    check_forward(spec, {"B": 2, "T": 5})
    check_backward(spec, {"B": 2, "T": 5})
    forward = lower_spec(spec)["forward"]
    compares = [n for n in forward.nodes() if n.op in ("ge", "lt", "le", "gt")]
    assert compares and all({a.op for a in n.args} == {"rowiota", "iota"} for n in compares)
