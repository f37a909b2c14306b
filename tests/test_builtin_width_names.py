"""A size is named by its example at the trace's sizes: sizes that only match a dim's example by
coincidence, or pieces one value wide, are refused rather than lowered wrong (the red team of
session 41 found each of these lowered, and wrong on the CPU interpreter)."""
from __future__ import annotations

import pytest

from builtin_support import own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source


@pytest.mark.parametrize("name, why", [
    ("column_shift_max", "none of the signature's dims"),  # D - 1 was taken for N + 1
    ("column_shift2_max", "no tensor of the signature has as its columns"),  # D - 2 = 5 = N at the example
    ("chunk_width_one", "column slice"),  # a piece one value per row was a plain row load of rows 0..B*C
])
def test_a_size_that_only_matches_by_example_is_refused(name, why):
    with pytest.raises(AgentRefused) as info:
        build_source(own_spec(name))
    assert why in str(info.value)
    assert str(info.value).startswith(str(own_spec(name).path))  # the refusal names the spec file
