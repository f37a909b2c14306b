"""torch.max / torch.min over the columns inside the row family (its last retry, where the axis
family refuses: these specs, which the axis family takes, are lowered by that retry directly): the
values are amax's, the index the first column holding them (or the first NaN, as torch breaks
ties), and the backward puts each row's gradient at that index (aten.scatter of a per-row source);
checked by the CPU interpreter against the reference and autograd, on ties and NaN; nvcc
compiles; (GPU) verifies."""
from __future__ import annotations

import pytest
import torch

from builtin_support import check_backward, check_forward, own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin.emit import emit_source
from specgen.agents.builtin.schedule import DEFAULT_VARIANT
from specgen.agents.builtin.generator import _row_programs, lower_spec
from specgen.agents.builtin.interp import run_program

CASES = {"max_index_confidence": {"N": 5, "C": 9}, "max_shifted_logits": {"N": 5, "D": 9}}


@pytest.mark.parametrize("name", list(CASES))
def test_the_lowering_matches_the_reference(name):
    spec = own_spec(name)
    check_forward(spec, CASES[name], programs=_row_programs(spec, indices_in_rows=True))


def test_the_backward_matches_autograd():
    spec = own_spec("max_shifted_logits")
    check_backward(spec, CASES["max_shifted_logits"], programs=_row_programs(spec, indices_in_rows=True))


def test_the_index_is_a_second_sweep_and_only_the_last_retry_takes_it():
    spec = own_spec("max_index_confidence")
    forward = _row_programs(spec, indices_in_rows=True)["forward"]
    kinds = sorted(n.attrs["kind"] for n in forward.nodes() if n.op == "rowreduce")
    assert kinds.count("min") == 1  # the first column holding the max
    with pytest.raises(AgentRefused) as info:  # the first try leaves it to the axis family
        _row_programs(spec)
    assert "indices of a max inside a row computation" in str(info.value)
    assert type(lower_spec(spec)["forward"]).__name__ == "AxisProgram"


def test_ties_give_the_first_column_and_nan_the_first_nan():
    """The interpreter's program on rows built to tie and to hold NaN, against torch.max itself
    (random draws never tie)."""
    spec = own_spec("max_index_confidence")
    program = _row_programs(spec, indices_in_rows=True)["forward"]
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0],  # a three-way tie: column 1
                           [2.0, 2.0, 2.0, 2.0, 2.0],  # all equal: column 0
                           [0.0, float("nan"), 5.0, float("nan"), 1.0],  # the first NaN: column 1
                           [-1.0, -2.0, -0.5, -0.5, -3.0]], dtype=torch.float64)
    dims = {"N": 4, "C": 5}
    outs = {"confidence": torch.zeros(4, dtype=torch.float64), "label": torch.zeros(4, dtype=torch.int64)}
    run_program(program, {"logits": logits}, {"threshold": 0.0}, dims, outs)
    want_conf, want_label = spec.reference_fn()(logits, 0.0)
    assert outs["label"].tolist() == want_label.tolist() == [1, 0, 1, 2]
    torch.testing.assert_close(outs["confidence"], want_conf, equal_nan=True)


def _row_source(spec) -> str:
    return emit_source(spec, _row_programs(spec, indices_in_rows=True), DEFAULT_VARIANT)


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_the_row_kernels_compile_for_hopper(name):
    from specgen.agents.builtin.generator import compile_source

    spec = own_spec(name)
    compile_source(spec, _row_source(spec), arch="sm_90")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_the_row_kernels_verify_on_the_gpu(name):
    from specgen.verify import verify_kernel

    spec = own_spec(name)
    verdict = verify_kernel(spec, _row_source(spec))
    assert verdict.passed, verdict.summary()
