"""Row dims merged by a view, as models write their losses: logits [B, T, V] viewed as [B*T, V]
and labels as [B*T] (view(-1, V)), heads folded into the batch (view(B * H, Q, K)). The row
lowering reads an axis that merges consecutive row dims as those dims again (Lowering.expanded),
maps the axes of reductions, broadcasts, gathers and scatters through that, and refuses the ops
it does not map (scans, flips, strided views) on merged rows, with the reason."""
from __future__ import annotations

import pytest
import torch

from builtin_support import check_backward, check_forward, own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import run_program
from specgen.agents.builtin.lower import lower
from specgen.agents.builtin.trace import trace
from specgen.inputs import make_inputs

DIMS = [{"B": 2, "T": 3, "V": 5}, {"B": 1, "T": 1, "V": 1}, {"B": 3, "T": 1, "V": 4}, {"B": 2, "T": 9, "V": 33}]


def test_the_rows_are_the_signatures_row_dims():
    programs = lower_spec(own_spec("lm_loss_flat_view"))
    for program in programs.values():
        assert [str(d) for d in program.row_dims] == ["B", "T"]
        assert str(program.width_example) == str(program.dims_example["V"])
    assert any(n.op == "pretotal" for n in programs["backward"].nodes())  # the kept rows' count


@pytest.mark.parametrize("dims", DIMS)
def test_forward_and_backward_match_the_reference_in_float64(dims):
    spec = own_spec("lm_loss_flat_view")
    for seed in range(3):
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


MERGED_ELSEWHERE = {
    "heads_merged_softmax": ([{"B": 2, "H": 3, "Q": 5, "K": 7}, {"B": 1, "H": 1, "Q": 1, "K": 1}], ["B", "H", "Q"]),
    "tokens_merged_mid": ([{"B": 2, "T": 3, "H": 5, "D": 7}, {"B": 1, "T": 2, "H": 1, "D": 3}], ["B", "T", "H"]),
}


@pytest.mark.parametrize("name", list(MERGED_ELSEWHERE))
def test_merges_of_heads_into_the_batch_or_of_middle_dims(name):
    """scores.view(B * H, Q, K) (heads folded into the batch) and x.reshape(B, T * H, D) (middle
    row dims merged): the programs' rows are the signature's dims, and they match in float64."""
    dims_list, rows = MERGED_ELSEWHERE[name]
    spec = own_spec(name)
    for program in lower_spec(spec).values():
        assert [str(d) for d in program.row_dims] == rows
    for dims in dims_list:
        for seed in range(3):
            check_forward(spec, dims, seed=seed)
            check_backward(spec, dims, seed=seed)


def test_the_forward_matches_in_bfloat16():
    spec = own_spec("lm_loss_flat_view")
    dims = DIMS[-1]
    args = make_inputs(spec.signature, dims, "bfloat16", seed=4)
    outs = {"out": torch.full((), float("nan"), dtype=torch.float64)}
    run_program(lower_spec(spec)["forward"], dict(args), {}, dims, outs, acc=torch.float32)
    torch.testing.assert_close(outs["out"], spec.reference_fn()(**args).double(), rtol=2e-3, atol=2e-3)


def test_a_scan_of_merged_rows_is_refused_with_its_reason():
    with pytest.raises(AgentRefused) as info:
        lower(trace(own_spec("cumsum_flat_view"), "forward"))
    assert "cumsum_flat_view.yaml:" in str(info.value) and "a scan of rows merged by a view" in str(info.value)


def test_a_size_that_is_a_signature_dim_is_never_read_as_merged_rows():
    """expanded: a merged axis only where its size is no signature dim's (a dim equal to B*T
    stays that dim), read along the row dims from the first axis."""
    from specgen.agents.builtin.lower import Lowering

    lowering = Lowering(trace(own_spec("lm_loss_flat_view"), "forward"))
    b, t, v = lowering.rows + (lowering.t.dims["V"],)
    assert lowering.expanded((b * t, v)) == [(b, t), (v,)] and lowering.unmerged((b * t, v)) == (b, t, v)
    assert not lowering.merged((b, t, v)) and not lowering.merged((v,)) and not lowering.merged((t, b * t))
    assert [list(r) for r in lowering.axis_spans((b * t, v))] == [[0, 1], [2]]
    lowering.size_dims[b * t] = "a signature dim"
    assert not lowering.merged((b * t, v))


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["lm_loss_flat_view", *MERGED_ELSEWHERE])
def test_the_source_compiles(name):
    from specgen.agents.builtin.generator import compile_source

    spec = own_spec(name)
    compile_source(spec, build_source(spec), arch="sm_90")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["lm_loss_flat_view", *MERGED_ELSEWHERE])
def test_the_kernel_verifies_on_the_gpu(name):
    from specgen.verify import verify_kernel

    spec = own_spec(name)
    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()
