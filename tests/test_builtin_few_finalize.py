"""Few rows of a loss (a reduction over all rows: cross-entropy's mean) finalize in their own
cluster (Variant.few_fin "cluster"): up to FEW_FIN_ROWS rows' blocks run as one cluster whose first
block sums the blocks' partials and writes the loss, where the finalize kernel took a second launch.
The plan and the source on the CPU; on a GPU, the same bits as the finalize kernel's."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from specgen.agents.builtin import build_source
from specgen.agents.builtin.schedule import (DEFAULT_VARIANT, FEW_FIN_ROWS, few_finalized_in_cluster, few_rows_tpr,
                                             variant_named)
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"
BACKWARD = "// ======================= backward"
FEWTWO = variant_named("fewtwo")
LAUNCH = dataclasses.replace(FEWTWO, few_fin="launch")


def _in_cluster(variant, rows: int, chunks: int = 512, **kw) -> bool:
    tpr = few_rows_tpr(variant, rows, chunks, 132, row_free=False)
    return few_finalized_in_cluster(variant, rows, 1, tpr, **{"global_reductions": True,
                                                              "column_reductions": False, **kw})


def test_the_plan_finalizes_in_the_cluster_only_for_a_few_rows_of_a_loss_in_the_block_form():
    assert FEWTWO.few_fin == "cluster" and FEW_FIN_ROWS == 8  # a portable cluster
    assert all(_in_cluster(FEWTWO, rows) for rows in range(1, FEW_FIN_ROWS + 1))
    assert not _in_cluster(FEWTWO, FEW_FIN_ROWS + 1)  # more blocks than a portable cluster
    assert not _in_cluster(LAUNCH, 8)  # the separate finalize launch, asked for
    assert not _in_cluster(DEFAULT_VARIANT, 8)  # few rows over clusters of blocks: not this form
    assert not _in_cluster(FEWTWO, 8, chunks=64)  # too narrow for the few-rows schedule at all
    assert not _in_cluster(FEWTWO, 8, column_reductions=True)  # weight gradients: the finalize's own layout
    assert not _in_cluster(FEWTWO, 8, global_reductions=False)  # nothing to finalize
    # a program without row reductions keeps the clusters of blocks (one per row): not this form
    cluster_tpr = few_rows_tpr(FEWTWO, 8, 512, 132, row_free=True)
    assert cluster_tpr is not None and not few_finalized_in_cluster(
        FEWTWO, 8, 1, cluster_tpr, global_reductions=True, column_reductions=False, row_free=True)
    tpr = few_rows_tpr(FEWTWO, 8, 512, 132, row_free=False)
    assert not few_finalized_in_cluster(FEWTWO, 8, 2, tpr, global_reductions=True, column_reductions=False)


def test_the_host_skips_the_finalize_launch_and_its_workspace_exactly_when_the_plan_says():
    ce = load_spec(SPECS / "cross_entropy.yaml")
    forward, backward = build_source(ce, FEWTWO).split(BACKWARD)
    rule = re.search(r"const bool fin_cluster = few && groups == 1 && gx <= (\d+) && sg::clusters_ok<", forward)
    assert rule and int(rule.group(1)) == FEW_FIN_ROWS
    assert "if (!fin_cluster) cross_entropy_fwd_finalize_global<T><<<" in forward
    assert "const size_t partial_bytes = fin_cluster ? (size_t)0 : " in forward
    # the cluster launch hands the kernel no partials: its tail finalizes (the grid one cluster)
    assert "sg::launch_cluster_n(cross_entropy_fwd_rows<T, V, P, I, P, true>, grid, block, (int)gx, stream, args, " \
           "(float*)nullptr" in forward  # fewtwo's own instantiation (FEW)
    tail = forward.split("if (partials == nullptr) {", 1)[1].split("return;", 1)[0]
    assert tail.index("cluster.sync()") < tail.index("map_shared_rank") < tail.index("*(float*)A.out.data")
    assert "sg::launch_cluster_n" not in backward and "fin_cluster" not in backward  # no loss there
    assert "inline cudaError_t launch_cluster_n(" in forward  # its prelude part, in this kernel only
    off = build_source(ce, LAUNCH)
    assert "fin_cluster" not in off and "launch_cluster_n" not in off
    # programs with no reduction over all rows: the same text either way, byte for byte
    for op in ("softmax", "rmsnorm"):
        spec = load_spec(SPECS / f"{op}.yaml")
        assert build_source(spec, FEWTWO) == build_source(spec, LAUNCH)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_on_the_gpu_the_cluster_finalize_gives_the_finalize_kernels_bits_with_no_workspace():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from specgen.agents.builtin.generator import compile_many
    from specgen.verify.compare import compare
    from specgen.verify.data import prepare
    from specgen.verify.library import KernelLibrary
    from specgen.verify.strategies import make_case
    from specgen import abi

    ce = load_spec(SPECS / "cross_entropy.yaml")
    compiled = compile_many([(ce, build_source(ce, FEWTWO)), (ce, build_source(ce, LAUNCH))])
    for result in compiled:
        if isinstance(result, Exception):
            raise result
    fused, launched = (KernelLibrary(ce, r.library) for r in compiled)
    for rows in (1, 2, 5, 8, 9):
        for dtype in ("bfloat16", "float32"):
            data = prepare(ce, make_case({"N": rows, "C": 4096}, dtype, seed=rows), "forward", "cuda")
            losses = []
            for lib in (fused, launched):
                tensors = {**data.inputs, **{s.name: torch.empty(s.shape, dtype=s.dtype, device="cuda")
                                             for s in data.outputs}}
                need = lib.workspace_bytes("forward", tensors, data.scalars, data.dims)
                if lib is fused:  # one cluster needs no partials; past 8 rows the finalize kernel's
                    assert (need == 0) == (rows <= FEW_FIN_ROWS), (rows, dtype, need)
                if need:
                    tensors[abi.WORKSPACE] = torch.empty(need, dtype=torch.uint8, device="cuda")
                code = lib.launcher("forward", tensors, data.scalars, data.dims, torch.cuda.current_stream())()
                torch.cuda.synchronize()
                assert code == 0, (rows, dtype, lib.error_name(code))
                for name, truth in data.truth.items():
                    assert compare(tensors[name], truth, data.atol[name], data.rtol, data.reference.get(name)) is None
                losses.append(tensors["out"].clone())
            assert torch.equal(losses[0], losses[1]), (rows, dtype, losses)
