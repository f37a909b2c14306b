"""Few wide rows looped over a cluster of blocks (Variant.loop_cluster, variant `loopcl`).

LayerNorm over [C, H, W] of 128 samples (held-out problems-v7, session 34) streamed each 4M-value
row through one 512-thread block: one block's loads in flight per SM, 30% of HBM. With `loopcl`
the host gives a row a cluster of 8 blocks while the rows are at most two a SM, on sm_90+ code,
for programs that write elements (column partials too: a slot per cluster); the kernel's looped
pass and its row reductions already span a cluster (lane, TPR and sg::group_* over TPR / BLOCK
blocks).
"""
from __future__ import annotations

import re

import pytest
from builtin_support import own_spec
from conftest import SPECS

from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import shape_class_of
from specgen.agents.builtin.schedule import DEFAULT_VARIANT, VARIANTS, plan, variant_named
from specgen.spec import load_spec

LOOPCL = variant_named("loopcl")


def _directions(source: str) -> list[str]:
    return source.split("// ======================= backward")


def test_loopcl_is_a_wide_class_variant_the_default_leaves_off():
    assert LOOPCL in VARIANTS and LOOPCL.loop_cluster == 8 and DEFAULT_VARIANT.loop_cluster == 1
    assert (LOOPCL.loop_tpr * 8, 0) in LOOPCL.schedules and LOOPCL.schedules[-1] == (LOOPCL.loop_tpr, 0)
    assert not any(DEFAULT_VARIANT.is_loop_cluster(*s) for s in DEFAULT_VARIANT.schedules)
    # the Python mirror cannot know the rows: it keeps the one-block loop, the same shape class
    assert plan(LOOPCL, 1 << 20, 8) == (LOOPCL.loop_tpr, 0)


def test_few_wide_rows_take_a_cluster_of_eight_blocks_behind_a_gate():
    forward, backward = _directions(build_source(own_spec("layernorm_chw_few_rows"), LOOPCL))
    gate = re.search(r"const bool loop_cl_ok = (.*);", forward).group(1)
    assert "rows <= 2 * (int64_t)sg::sm_count()" in gate and "vec_ok" in gate
    assert "sg::clusters_ok<layernorm_chw_few_rows_fwd_rows<T, VEC, 4096, 0, 512>>()" in gate
    assert "if (tpr == 0 && loop_cl_ok) { tpr = 4096; items = 0; }" in forward
    # picked after every schedule in registers (split rows included), before the one-block loop
    picks = re.findall(r"if \(tpr == 0[^{]*\{ tpr = (\d+); items = (\w+); \}", forward)
    assert picks[-2:] == [("4096", "0"), ("512", "0")]
    assert "launch_cluster<(P) / 512>(layernorm_chw_few_rows_fwd_rows<T, V, P, I, 512>" in forward
    assert "else if (tpr == 4096 && items == 0) SG_LAUNCH_LCL(VEC, 4096, 0);" in forward
    # the backward's weight and bias gradients are column partials: a slot per cluster (a row each
    # here), its blocks' lanes on distinct columns, the workspace sized from the same grid
    assert "if (tpr == 0 && loop_cl_ok) { tpr = 4096; items = 0; }" in backward
    assert "else if (tpr == 4096 && items == 0) SG_LAUNCH_LCL(VEC, 4096, 0);" in backward  # launched as one
    assert "launch_cluster<(P) / 512>(layernorm_chw_few_rows_bwd_rows<T, V, P, I, 512>" in backward
    assert "if (cl > 1) gx = per_group_blocks * cl;" in backward
    assert "const int64_t cslots = gx / cl * groups;" in backward  # host: clusters x groups
    assert "const int64_t bx = blockIdx.x / CL, nbx = gridDim.x / CL;" in backward  # kernel: the same slots
    assert "const int64_t cslots = nbx * gridDim.y;" in backward
    assert "for (int64_t c = lane; c * VEC < W; c += TPR)" in backward  # zeroed over the cluster's lanes
    assert shape_class_of(own_spec("layernorm_chw_few_rows"), "forward",
                          {"B": 8, "C": 16, "H": 128, "W": 128}, "float32", LOOPCL) == "wide"


def test_losses_and_the_default_variant_are_unchanged():
    # a loss writes no elements (split rows' rule: it reads a streamed row once anyway)
    assert "loop_cl_ok" not in build_source(load_spec(SPECS / "cross_entropy.yaml"), LOOPCL).split(
        "// ======================= backward")[0]
    assert "loop_cl_ok" not in build_source(own_spec("layernorm_chw_few_rows"))


@pytest.mark.nvcc
def test_the_looped_cluster_compiles_for_hopper():
    from specgen.agents.builtin.generator import compile_source

    spec = own_spec("layernorm_chw_few_rows")
    compile_source(spec, build_source(spec, LOOPCL), arch="sm_90")


@pytest.mark.gpu
def test_the_looped_cluster_passes_the_verifier():
    from specgen.verify import verify_kernel

    spec = own_spec("layernorm_chw_few_rows")
    verdict = verify_kernel(spec, build_source(spec, LOOPCL))
    assert verdict.passed, verdict.summary()


def test_the_tuner_times_loopcl_only_where_a_benchmark_row_is_few_and_wide():
    """At any other row the gate shuts and the kernel runs as the default's: timing it would
    only spend the tuner's budget (session 35's review)."""
    from specgen.agents.builtin import tune
    from specgen.agents.builtin.generator import few_wide_rows

    few = own_spec("layernorm_chw_few_rows")
    assert few_wide_rows(few) and "loopcl" in [v.name for v, _ in tune.candidates(few)[0]]
    for spec in (load_spec(SPECS / "softmax.yaml"), own_spec("layernorm_hw_affine")):
        assert not few_wide_rows(spec)
        pairs, notes = tune.candidates(spec)
        assert "loopcl" not in [v.name for v, _ in pairs] and "loopcl" in notes[0]
    # the same rows, more of them than two a SM: no longer few
    many = few.model_copy(update={"benchmark": [{"B": 16 * 132, "C": 16, "H": 128, "W": 128}]})
    assert not few_wide_rows(many)


STAGE = variant_named("loopstage")


def test_loopstage_stages_a_wide_row_once_for_any_number_of_rows():
    forward, backward = _directions(build_source(load_spec(SPECS / "softmax.yaml"), STAGE))
    for source, fields in ((forward, ["p_x_0"]), (backward, ["p_grad_out_0", "p_out_1"])):
        gate = re.search(r"const bool loop_cl_ok = (.*);", source).group(1)
        assert "stage_bytes <= sg::dyn_smem_limit<" in gate and "rows <=" not in gate  # any number of rows
        assert "sg::launch_clusters_dyn<" in source and ">>(grid, block, (P) / 512, stage_bytes, stream," in source
        for pn in fields:
            # staged once per row, by the thread that reads it back (slot j * BLOCK + tid: no barrier)
            assert f"s_{pn}[(c / TPR) * BLOCK + threadIdx.x] = l_{pn}[u];" in source
            reads = source.count(f"if constexpr (TPR > BLOCK) l_{pn}[u] = s_{pn}[(c / TPR) * BLOCK + threadIdx.x]; "
                                 f"else sg::load_raw<VEC>({pn} + c * VEC, l_{pn}[u]);")
            assert reads >= 2  # every looped sweep of the row reads the stage
        # the host's bytes are the kernel's: SJ chunks a thread, BLOCK threads, 16-byte slots a field
        assert "const int64_t SJ = (W / VEC + TPR - 1) / TPR;" in source
        assert source.count("stage_at += (size_t)SJ * BLOCK * ((sizeof(sg::Raw<T, VEC>) + 15) / 16 * 16);") == len(fields)
        host = re.search(r"const size_t stage_bytes = (.*);", source).group(1)
        assert host.startswith("(size_t)((chunks + 4096 - 1) / 4096) * 512 * (")
        assert host.count("(sizeof(sg::Raw<T, VEC>) + 15) / 16 * 16") == len(fields)
    # a [W] parameter stays in L2: LayerNorm's weight and bias are not staged
    ln = _directions(build_source(own_spec("layernorm_chw_few_rows"), STAGE))[0]
    assert "s_p_x_0" in ln and "s_p_weight" not in ln and "s_p_bias" not in ln


def test_the_stage_slots_of_a_cluster_row_are_each_threads_own():
    """Chunk c of a looped cluster row (TPR = 4096 threads over 8 blocks of 512) is read and
    written by thread lane = c % TPR; its slot (c // TPR) * BLOCK + lane % BLOCK in block
    lane // BLOCK is unique there and inside the block's SJ * BLOCK slots."""
    tpr, block = 4096, 512
    for chunks in (1, 511, 4096, 4097, 98304, 98305):
        sj = (chunks + tpr - 1) // tpr
        seen = {}
        for c in range(chunks):
            lane = c % tpr
            rank, slot = lane // block, (c // tpr) * block + lane % block
            assert 0 <= slot < sj * block
            assert seen.setdefault((rank, slot), lane) == lane and (rank, slot, c) not in seen
            seen[(rank, slot, c)] = True
        assert len([k for k in seen if len(k) == 2]) == chunks  # no two chunks share a block's slot


def test_the_tuner_tries_loopstage_wherever_a_benchmark_row_is_wide():
    from specgen.agents.builtin import tune

    softmax = load_spec(SPECS / "softmax.yaml")
    names = [v.name for v, _ in tune.candidates(softmax)[0]]
    assert "loopstage" in names and "loopcl" not in names  # many wide rows: staged, not the few-rows form


def test_loopstage_keeps_the_few_rows_gate_where_staging_buys_nothing_or_partials_would_grow():
    """A review of loopstage (session 36): a program without row reductions reads each value once
    (swiglu: nothing to stage, and one staged block an SM would stream at a fraction of the
    default's occupancy); a program with column partials takes a slot of them per cluster, so past
    two rows a SM they would be the input's size again (layernorm_gelu's backward at 4096 x 8192
    float32: 268 MB of partials for a 134 MB input)."""
    swiglu = build_source(load_spec(SPECS / "swiglu.yaml"), STAGE)
    assert "stage_bytes" not in swiglu and "s_p_" not in swiglu
    assert re.search(r"const bool loop_cl_ok = vec_ok && rows <= 2 \* \(int64_t\)sg::sm_count\(\) && ", swiglu)
    backward = _directions(build_source(load_spec(SPECS / "layernorm_gelu.yaml"), STAGE))[1]
    gate = re.search(r"const bool loop_cl_ok = (.*);", backward).group(1)
    assert "stage_bytes <= sg::dyn_smem_limit<" in gate and "rows <= 2 * (int64_t)sg::sm_count()" in gate
    forward = _directions(build_source(load_spec(SPECS / "layernorm_gelu.yaml"), STAGE))[0]  # no partials
    assert "rows <=" not in re.search(r"const bool loop_cl_ok = (.*);", forward).group(1)


def test_a_looped_cluster_block_has_no_register_cap_and_the_default_keeps_its_own():
    bounds = r"__launch_bounds__\(BLOCK, (.*)\)$"
    staged = re.search(bounds, build_source(load_spec(SPECS / "softmax.yaml"), STAGE), re.M).group(1)
    assert staged.startswith("(TPR > BLOCK && ITEMS == 0) ? 1 : sg::min_blocks(")
    default = re.search(bounds, build_source(load_spec(SPECS / "softmax.yaml")), re.M).group(1)
    assert default.startswith("sg::min_blocks(") and "TPR > BLOCK" not in default


@pytest.mark.nvcc
def test_the_looped_cluster_blocks_the_review_saw_spill_compile_without_spills():
    """Under the 64-register cap these looped cluster instantiations spilled 14-44 bytes (a review,
    session 36); they run one block an SM (staged) or few rows, so no cap."""
    from specgen.agents.builtin.generator import compile_source

    for name in ("entropy_total", "module_layernorm_shape", "ce_smooth_ignore"):
        spec = own_spec(name)
        resources = compile_source(spec, build_source(spec, STAGE), arch="sm_90").resources
        cluster = {k: r for k, r in resources.items() if ", 4096, 0, 512>" in k}
        assert cluster, name
        assert all(r["spill_store_bytes"] == 0 for r in cluster.values()), (name, cluster)


@pytest.mark.nvcc
def test_the_staged_looped_cluster_compiles_for_hopper():
    from specgen.agents.builtin.generator import compile_source

    for spec in (load_spec(SPECS / "softmax.yaml"), own_spec("layernorm_chw_few_rows")):
        compile_source(spec, build_source(spec, STAGE), arch="sm_90")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "layernorm_chw_few_rows"])
def test_the_staged_looped_cluster_passes_the_verifier(name):
    from specgen.verify import verify_kernel

    spec = load_spec(SPECS / "softmax.yaml") if name == "softmax" else own_spec(name)
    verdict = verify_kernel(spec, build_source(spec, STAGE))
    assert verdict.passed, verdict.summary()


def test_every_cluster_gate_asks_whether_a_cluster_of_eight_can_be_placed():
    """A cluster that cannot be placed (MIG, MPS: a GPC with too few SMs) failed the launch; the
    gate now asks the occupancy of an 8-block cluster at the kernel's largest block once a device,
    and the host takes its one-block path where it is 0 (the sm_80 path, verified there)."""
    source = build_source(own_spec("layernorm_chw_few_rows"))
    gate = source[source.index("inline bool clusters_ok()"):]
    gate = gate[:gate.index("\n}\n")]
    assert "clusters_placeable<Kernel>(fa)" in gate
    placeable = source[source.index("inline bool clusters_placeable("):]
    placeable = placeable[:placeable.index("\n}\n")]
    assert "cudaOccupancyMaxActiveClusters(&clusters, Kernel, &cfg)" in placeable
    assert "clusterDim.x = 8;" in placeable and "return e == cudaSuccess && clusters > 0;" in placeable


@pytest.mark.gpu
@pytest.mark.nvcc
def test_on_a_whole_hopper_gpu_the_cluster_gate_is_open(tmp_path):
    """The placement query must say yes on a whole H100/H200, or every cluster form would silently
    fall back to one block: the prelude's gate, compiled for sm_90 with a 512- and a 1024-thread
    kernel and run."""
    import subprocess

    from specgen.agents.builtin.prelude import PRELUDE
    from specgen.toolchain.cuda import find_cuda_toolkit

    source = tmp_path / "gate.cu"
    source.write_text(PRELUDE + """
#include <cstdio>
__global__ void __launch_bounds__(512) k512(float* p) { if (p) p[threadIdx.x] = 0.f; }
__global__ void __launch_bounds__(1024) k1024(float* p) { if (p) p[threadIdx.x] = 0.f; }
int main() {
  std::printf("gate %d %d\\n", (int)sg::clusters_ok<k512>(), (int)sg::clusters_ok<k1024>());
  return 0;
}
""")
    binary = tmp_path / "gate"
    subprocess.run([str(find_cuda_toolkit().nvcc), "-std=c++17", "-arch=sm_90", "-o", str(binary), str(source)], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "gate 1 1", out
