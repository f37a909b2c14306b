"""A column output whose finishing step reads a [W] parameter: the gradient of a gain through
|gain * c| is sign(gain * c) * c times a column sum, so the finalize kernel's epilogue reads the
gain at its column j. The epilogue named only the summed partials and crashed ("emit: no expression
for load"): held-out problems-v9's first contact, session 37. CPU: the program against the
reference, the source, nvcc; GPU: the verifier."""
from __future__ import annotations

import pytest
from builtin_support import check_backward, check_forward, compiles_for_hopper, own_spec, verifies_on_the_gpu

from specgen.agents.builtin import build_source


def _finalize(source: str) -> str:
    start = source.index("_finalize_cols(")
    return source[start:source.index("\n}\n", start)]


def test_the_epilogue_reads_the_gain_at_its_column():
    source = build_source(own_spec("abs_gain_rows"))
    assert "((const T*)A.gain.data)[j]" in _finalize(source)


@pytest.mark.parametrize("dims", [{"N": 5, "D": 7}, {"N": 1, "D": 1}, {"N": 64, "D": 3}])
def test_forward_and_backward_match_on_the_cpu(dims):
    spec = own_spec("abs_gain_rows")
    check_forward(spec, dims)
    check_backward(spec, dims)


@pytest.mark.nvcc
def test_the_source_compiles_for_hopper():
    compiles_for_hopper(own_spec("abs_gain_rows"))


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_kernel_verifies_on_the_gpu():
    verifies_on_the_gpu(own_spec("abs_gain_rows"))
