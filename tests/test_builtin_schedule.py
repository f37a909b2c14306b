"""The builtin generator's schedules: which class a shape falls in, the per-class combination
of autotuned variants, and what the generated source does for each class (no GPU needed)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from specgen.agents.builtin import build_source
from specgen.agents.builtin.schedule import (CLASS_FIELDS, DEFAULT_VARIANT, FEW_TPRS, VARIANTS, Variant, combine, items_max, few_block_tprs, few_rows_tpr,
                                             plan, variant_named, variants_named)
from specgen.agents.builtin.generator import shape_class_of
from specgen.spec import load_spec

from builtin_support import without_saved

SPECS = Path(__file__).resolve().parent.parent / "specs"
SAVED = Path(__file__).resolve().parent / "saved_specs"


@pytest.mark.parametrize("op, direction, dims, dtype, expected", [
    ("softmax", "forward", {"N": 16384, "D": 8192}, "bfloat16", "medium"),
    ("softmax", "forward", {"N": 16384, "D": 8192}, "float32", "medium"),
    ("softmax", "forward", {"N": 1024, "D": 131072}, "bfloat16", "split"),  # a cluster of 4 blocks per row
    ("softmax", "forward", {"N": 1024, "D": 131072}, "float32", "split"),  # a cluster of 8
    ("cross_entropy", "backward", {"N": 1024, "C": 131072}, "float32", "split"),
    ("cross_entropy", "forward", {"N": 1024, "C": 131072}, "float32", "wide"),  # a loss: read once anyway
    ("rmsnorm", "backward", {"N": 4, "D": 262144}, "float32", "wide"),  # column partials: never split
    ("softmax", "forward", {"N": 64, "D": 256}, "float32", "narrow"),
    ("cross_entropy", "forward", {"N": 8192, "C": 32768}, "float32", "medium"),  # 128 KB rows in registers
    ("layernorm_gelu", "backward", {"N": 16384, "D": 4096}, "bfloat16", "medium"),
])
def test_benchmark_shapes_fall_in_the_expected_class(op, direction, dims, dtype, expected):
    assert shape_class_of(load_spec(SPECS / f"{op}.yaml"), direction, dims, dtype) == expected


def test_a_row_is_held_by_the_fewest_threads_with_several_16_byte_loads_each():
    # one input of bf16 (4 registers per 16-byte chunk): 8 chunks per thread
    imax = items_max(DEFAULT_VARIANT, 4)
    assert imax == 8
    assert plan(DEFAULT_VARIANT, 8192 // 8, imax) == (128, 8)  # D = 8192 bf16: 128 threads per row
    assert plan(DEFAULT_VARIANT, 1024 // 8, imax) == (32, 4)  # D = 1024: one warp per row, 4 rows per block
    assert plan(DEFAULT_VARIANT, 131072 // 8, imax) == (2048, 8)  # too wide for a block: a cluster of 4
    assert plan(DEFAULT_VARIANT, 131072 // 8, imax, split=False) == (512, 0)  # no clusters: streamed
    assert plan(DEFAULT_VARIANT, 4 * 131072 // 8, imax) == (512, 0)  # too wide for a cluster of 8
    assert items_max(DEFAULT_VARIANT, 40) == 1  # many inputs: one chunk, the launch bounds relax


def test_combine_takes_each_class_from_its_winner():
    by_name = {v.name: v for v in VARIANTS}
    chosen = combine({"narrow": by_name["rows256"], "medium": by_name["regs16"], "wide": by_name["loop1024"]})
    assert (chosen.row_block, chosen.data_regs, chosen.items_cap, chosen.loop_tpr) == (256, 16, 4, 1024)
    assert combine({}) == Variant(DEFAULT_VARIANT.name)
    fields = [f for names in CLASS_FIELDS.values() for f in names]
    assert len(fields) == len(set(fields))  # a field steers one class
    assert set(fields) == {f.name for f in dataclasses.fields(Variant)} - {"name"}  # and every field is tuned
    for v in VARIANTS[1:]:  # each variant changes exactly one class
        changed = {cls for cls, fields in CLASS_FIELDS.items()
                   if any(getattr(v, f) != getattr(DEFAULT_VARIANT, f) for f in fields)}
        assert len(changed) == (2 if v.name in ("cl256", "cl256two") else 1), v.name  # cl256*: the row's block, both classes


def test_wide_softmax_takes_one_online_pass_for_max_and_sum():
    source = build_source(load_spec(SPECS / "softmax.yaml"))
    forward = source.split("// ======================= backward")[0]
    assert "sg::online_add_vec<T, VEC>(" in forward and "sg::group_online<TPR, BLOCK>(" in forward
    # one online pass and one (max, sum) reduction round, whether the row is streamed or in registers
    assert forward.count("// pass 1: max and sum of exp(x - max) over the row") == 1
    assert forward.count("sg::group_online<TPR, BLOCK>(") == 1
    assert "sg::Max()" not in forward.split("// ---- end of helpers ----")[1]


def _streamed_passes(source: str) -> int:
    return source.count("for (int64_t c0 = lane; c0 * VEC < W; c0 += (int64_t)UNROLL * TPR)")


def test_wide_cross_entropy_backward_reads_the_logits_twice_not_three_times(tmp_path):
    # recomputing its statistics (no saved lse), the backward's first batch is max(x) plus the sum
    # over the target column: the max still pairs with sum(exp(x - max)) in one online pass, the
    # other sum riding along
    source = build_source(without_saved(SPECS / "cross_entropy.yaml", tmp_path))
    forward, backward = source.split("// ======================= backward")
    assert backward.count("sg::group_online<TPR, BLOCK>(") == 1
    assert _streamed_passes(backward) == 2  # online (max, sum, target sum), then the gradient
    assert _streamed_passes(forward) == 1  # the loss needs no second sweep
    # with a saved (max, logsum) pair (specs/cross_entropy.yaml since session 29): one pass, no
    # reduction over the row; a float32 lse is not read (saved_rows.lse_reads_exactly): two passes
    for spec in (load_spec(SPECS / "cross_entropy.yaml"), load_spec(SAVED / "cross_entropy_max_logsum.yaml")):
        saved = build_source(spec).split("// ======================= backward")[1]
        assert "sg::group_online<TPR, BLOCK>(" not in saved and _streamed_passes(saved) == 1
    lse = build_source(load_spec(SAVED / "cross_entropy_lse.yaml")).split("// ======================= backward")[1]
    assert _streamed_passes(lse) == 2


def test_transcendentals_follow_the_storage_dtype():
    source = build_source(load_spec(SPECS / "gelu_tanh.yaml"))
    assert "sg::tanh_<T>(" in source and "tanhf(" in source  # fast form only for 16-bit T (prelude)
    assert "sizeof(T) == 2) return __expf(x); else return expf(x);" in source


def test_row_stays_raw_in_registers_and_only_column_partials_keep_one_wave_of_blocks():
    source = build_source(load_spec(SPECS / "rmsnorm.yaml"))
    forward, backward = source.split("// ======================= backward")
    assert "sg::Raw<T, VEC> r_p_x_" in source and "sg::load_raw<VEC>(" in source
    assert "__launch_bounds__(BLOCK, sg::min_blocks(" in source
    assert "gx = per_group_blocks;  // not persistent" in forward  # a block per row
    assert "gx = per_group_blocks;  // not persistent" not in backward  # weight-grad partials per block
    wave = build_source(load_spec(SPECS / "rmsnorm.yaml"), _variant("wave"))
    assert "// not persistent" not in wave
    assert not re.search(r"\) / \(acc_t\)\(rsqrt", source)  # per-row denominators are reciprocals


def test_softmax_backward_reads_the_forward_output():
    source = build_source(load_spec(SPECS / "softmax.yaml"))
    backward = source.split("// ======================= backward")[1]
    assert "A.out.data" in backward and "A.x.data" not in backward
    assert "exp_" not in backward.split("extern \"C\"")[0].split("_rows(")[1]


@pytest.mark.nvcc
@pytest.mark.slow
def test_row_in_register_schedules_do_not_spill_for_softmax():
    from specgen.agents.builtin.generator import compile_source

    spec = load_spec(SPECS / "softmax.yaml")
    compiled = compile_source(spec, build_source(spec), arch="sm_90")
    rows = {k: r for k, r in compiled.resources.items() if "_rows<" in k}
    assert rows
    for name, r in rows.items():
        assert r["registers"] <= 64, name  # >= 1024 threads resident per SM
        assert r["spill_store_bytes"] == 0, name


def test_split_rows_launch_a_cluster_only_for_programs_without_column_partials():
    softmax = build_source(load_spec(SPECS / "softmax.yaml"))
    assert softmax.count("sg::launch_cluster<(P) / 512>(") == 2  # forward and backward
    assert "sg::clusters_ok<softmax_fwd_rows<T, VEC, 2048, ITEMS_MAX, 512>>()" in softmax
    assert "sg::group_reduce<TPR, BLOCK>(" in softmax and "sg::group_reduce<TPR>(" not in softmax
    rmsnorm = build_source(load_spec(SPECS / "rmsnorm.yaml"))
    forward, backward = rmsnorm.split("// ======================= backward")
    assert "SG_LAUNCH_CL(VEC, 2048" in forward  # the forward has no column partials
    assert "SG_LAUNCH_CL(VEC" not in backward.split("#define SG_LAUNCH_CL")[1]  # weight grad: no split


def test_twopass_variant_keeps_exact_sweeps_for_rows_in_registers():
    spec = load_spec(SPECS / "cross_entropy.yaml")
    twopass = build_source(spec, _variant("twopass"))
    forward = twopass.split("// ======================= backward")[0]
    assert "if constexpr (ITEMS > 0 && TPR > 32 && TPR <= BLOCK) {  // medium row: the exact two-pass form" \
        in forward
    assert forward.count("sg::group_online<TPR, BLOCK>(") == 1  # narrow, split, streamed rows stay online
    assert "exact two-pass form" not in build_source(spec)  # default: one sweep


def test_variants_are_picked_by_name_and_an_unknown_name_is_named():
    from specgen.agents.builtin.schedule import variants_named

    assert [v.name for v in variants_named("default, twopass")] == ["default", "twopass"]
    assert variants_named("") == []
    with pytest.raises(ValueError, match=r"no variant twopas; variants: default, .*twopass"):
        variants_named("default,twopas")


def _variant(name: str) -> Variant:
    (variant,) = variants_named(name)
    return variant


def test_a_row_in_registers_takes_its_exact_max_then_its_exps_then_one_round():
    forward = build_source(load_spec(SPECS / "softmax.yaml")).split("// ======================= backward")[0]
    registers = forward.split("// in registers: this thread's exact (max, sum)")[1].split("} else {  // streamed")[0]
    assert "sg::online_add_vec" not in registers  # no per-chunk rescale chain
    assert registers.index("sg::max_(") < registers.index("sg::exp_<T>(")
    assert "(acc_t)(-INFINITY)) {  // else no element here adds anything" in registers  # exp(-inf - -inf) = NaN
    assert forward.count("sg::group_online<TPR, BLOCK>(") == 1 and "sg::group_reduce<" not in forward.split(
        "// ---- end of helpers ----")[1]
    online = build_source(load_spec(SPECS / "softmax.yaml"), _variant("online"))
    assert "// in registers: this thread's exact" not in online and "sg::online_add_vec<T, VEC>(" in online


def test_two_reductions_of_one_sweep_share_a_round(tmp_path):
    rmsnorm = without_saved(SPECS / "rmsnorm.yaml", tmp_path)  # (the example saves its rstd: one sum left)
    backward = build_source(rmsnorm).split("// ======================= backward")[1]
    assert backward.count("sg::group_reduce2<TPR, BLOCK>(") == 1  # sum(x * x) and sum(g * w * x)
    assert "sg::group_reduce<TPR, BLOCK>(" not in backward


def test_cl256_splits_rows_over_clusters_of_256_thread_blocks():
    cl256 = _variant("cl256")
    assert plan(cl256, 32768 // 8, 8) == (512, 8) and cl256.is_split(512, None)  # CE bf16 C=32768: 2 x 256
    assert [cl256.split_block_of(t) for t in (512, 1024, 2048, 4096)] == [256, 256, 256, 512]
    assert plan(cl256, 32768 // 8, 8, split=False) == (512, 0)  # a loss row: streamed once
    assert plan(DEFAULT_VARIANT, 32768 // 8, 8) == (512, 8) and not DEFAULT_VARIANT.is_split(512, None)
    source = build_source(load_spec(SPECS / "cross_entropy.yaml"), cl256)
    backward = source.split("// ======================= backward")[1]
    assert ("int block = few ? tpr / 8 : items > 0 && tpr > 4095 ? 512 : items > 0 && tpr > 256 ? 256 : "
            "tpr > 32 ? tpr : 128;") in backward
    assert "{ tpr = 512; items = ITEMS_MAX; }  // a cluster of 2 blocks" in backward
    assert "sg::launch_cluster<(P) / ((P) / 8 > 256 ? (P) / 8 : 256)>(" in backward
    forward = source.split("// ======================= backward")[0]
    assert "SG_LAUNCH_CL(VEC" not in forward.split("#define SG_LAUNCH_CL")[-1]  # the loss never splits


def test_csmem_keeps_column_partials_and_parameters_out_of_registers():
    source = build_source(load_spec(SPECS / "rmsnorm.yaml"), _variant("csmem"))
    forward, backward = source.split("// ======================= backward")
    assert "csm" not in forward.split("// ---- end of helpers ----")[1]  # no column partials there
    assert "sg::smem_add_vec<VEC>(csm + 0 * W + c * VEC, ccl_0);" in backward
    assert "sg::launch_dyn<rmsnorm_bwd_rows<" in backward and "csm_ok && chunks <=" in backward
    assert "r_p_weight_1[" not in backward and "lz_p_weight_1" in backward  # weight re-read per use
    assert "if constexpr (8 <= ITEMS_NMAX)" in backward  # narrow rows: partials still in registers
    # a looped row (I == 0) adds into its partials in place: launched with no shared memory (asking
    # csm_bytes failed the launch past the device's opt-in, W over ~58K floats)
    assert "((P) > 32 ? ((I) > 0 ? csm_bytes : (size_t)0) :" in backward
    assert "(P) > 32 && (I) > 0 ? csm_bytes : 0)" in backward
    default = build_source(load_spec(SPECS / "rmsnorm.yaml"))
    assert "r_p_weight_1[" in default and "csm" not in default.split("// ---- end of helpers ----")[1]


def _c_ternary(expr: str, env: dict) -> int:
    """Evaluate a generated `c1 ? v1 : c2 ? v2 : v` chain of int comparisons."""
    head, sep, rest = expr.partition(" ? ")
    if not sep:
        return int(eval(expr, {}, env))
    value, _, tail = rest.partition(" : ")
    cond = head.replace("&&", "and")
    return int(eval(value, {}, env)) if eval(cond, {}, env) else _c_ternary(tail, env)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("op", ["softmax", "rmsnorm", "cross_entropy"])
def test_host_block_size_matches_the_kernel_instantiation_of_every_schedule(op, variant):
    # the launch's blockDim must be the kernel's BLOCK: a looped 512-thread row once got the
    # 256-thread block of cl256's split rows and hung at its first barrier
    source = build_source(load_spec(SPECS / f"{op}.yaml"), variant)
    for direction_source in source.split("// ======================= backward"):
        expr = re.search(r"(?:const )?int block = (.*?);  //", direction_source).group(1)
        if "few ? tpr :" in expr:  # few rows, a whole block each (programs with row reductions): never split
            assert variant.few_form == "block"
            for tpr in few_block_tprs(variant):
                assert _c_ternary(expr, {"few": 1, "tpr": tpr, "items": 2}) == tpr
        elif "few ?" in expr:  # few rows: a cluster of 8 blocks of TPR / 8 threads, as the launch instantiates them
            assert variant.few_rows and "#define SG_LAUNCH_FEW(V, P) do { const cudaError_t e_ = sg::launch_cluster<8>(" \
                in direction_source and ", V, P, 1, (P) / 8>, grid, block," in direction_source
            for tpr in FEW_TPRS:
                assert _c_ternary(expr, {"few": 1, "tpr": tpr, "items": 1}) == tpr // 8
        for tpr, items in list(variant.schedules) + [(32, 1), (256, 0)]:
            items_value = 8 if items is None else items
            block = _c_ternary(expr, {"few": 0, "tpr": tpr, "items": items_value})
            if variant.is_loop_cluster(tpr, items):  # a looped row over a cluster: loop_tpr threads a block
                looped = re.search(r"#define SG_LAUNCH_LCL\(V, P, I\) (.*)", direction_source)
                if looped is None:  # this direction never splits a row: the schedule is not in its chain
                    assert f"tpr == {tpr} && items == 0" not in direction_source
                    continue
                cluster = re.search(r"\(P\) / (\d+)", looped.group(1)).group(1)  # blocks: P / this
                kernel_block = re.search(r"\w+_rows<T, V, P, I, (\d+)>", looped.group(1)).group(1)
                assert block == variant.loop_tpr == int(cluster) == int(kernel_block)
                assert tpr // block == variant.loop_cluster <= 8
            elif variant.is_split(tpr, items):
                assert block == variant.split_block_of(tpr) and 2 <= tpr // block <= 8
                macro = re.search(r"sg::launch_cluster<\(P\) / (.*?)>\(", direction_source)
                if macro:  # the launch's cluster size and the kernel's BLOCK
                    assert _c_ternary(macro.group(1).replace("(P)", "P").strip("()"), {"P": tpr}) == block
            else:
                assert block == (tpr if tpr > 32 else variant.row_block), (tpr, items, block)


def test_weight_grads_finalize_in_column_tiles_and_grouped_ones_per_column(tmp_path):
    # one group of all rows (hundreds of slots): 32-column blocks whose warps split the slots;
    # rope's per-position groups (a few slots each; rope with its cos/sin gradients, which
    # specs/rope.yaml no longer asks for): a thread per column
    rmsnorm = build_source(load_spec(SPECS / "rmsnorm.yaml")).split("// ======================= backward")[1]
    assert "for (int64_t s = warp; s < per_group; s += 8)" in rmsnorm and "__shared__ double fin[1][8][32];" in rmsnorm
    assert "rmsnorm_bwd_finalize_cols<T><<<dim3((unsigned)((W + 31) / 32)" in rmsnorm
    with_tables = tmp_path / "rope.yaml"
    with_tables.write_text((SPECS / "rope.yaml").read_text().replace("no_grad: [cos, sin]\n", ""))
    rope = build_source(load_spec(with_tables)).split("// ======================= backward")[1]
    assert "for (int64_t s = 0; s < per_group; ++s)" in rope and "fin[" not in rope


def test_moments_variant_takes_layernorm_mean_and_variance_in_one_round():
    source = build_source(load_spec(SPECS / "layernorm_gelu.yaml"), _variant("moments"))
    forward, backward = source.split("// ======================= backward")
    for part in (forward, backward):
        registers = part.split("// in registers: this thread's exact moments, one round")[1].split("} else {")[0]
        assert "const acc_t wmean = wn > (acc_t)0 ?" in registers  # the thread's own mean, then deviations
        assert registers.count("sg::group_moments<TPR, BLOCK>(wn, ") == 1 and "group_reduce" not in registers
    assert "__device__ __forceinline__ void group_moments(" in source
    two = build_source(load_spec(SPECS / "layernorm_gelu.yaml"))  # the default: two rounds
    assert "group_moments" not in two and two.count("sg::group_reduce<TPR, BLOCK>(") >= 2
    for op in ("rmsnorm", "softmax", "cross_entropy"):  # no (mean, deviations) pair: no moments code
        assert "group_moments" not in build_source(load_spec(SPECS / f"{op}.yaml"))


def test_few_rows_spread_over_a_cluster_only_while_they_leave_the_sms_idle():
    softmax, rmsnorm, swiglu = (load_spec(SPECS / f"{op}.yaml") for op in ("softmax", "rmsnorm", "swiglu"))
    # 8 rows of 4096 bf16 (512 chunks): 8 clusters of 8 blocks; 64 rows already fill the H200's 132 SMs
    assert few_rows_tpr(DEFAULT_VARIANT, 8, 512, 132) == 512
    assert shape_class_of(softmax, "forward", {"N": 8, "D": 4096}, "bfloat16") == "few"
    assert shape_class_of(softmax, "forward", {"N": 33, "D": 4096}, "bfloat16") == "few"
    assert shape_class_of(softmax, "forward", {"N": 34, "D": 4096}, "bfloat16") == "medium"
    assert shape_class_of(softmax, "forward", {"N": 8, "D": 1024}, "bfloat16") == "narrow"  # 128 chunks: too narrow
    assert shape_class_of(softmax, "forward", {"N": 8, "D": 4096}, "bfloat16", _variant("nofew")) == "medium"
    # a row reduction pays the cluster's rounds: only where the plain schedule gives a thread 64+
    # elements (softmax forward bf16: 8 chunks of 8); float32's 8 chunks of 4 keep a block per row
    assert shape_class_of(softmax, "forward", {"N": 8, "D": 4096}, "float32") == "medium"
    assert few_rows_tpr(DEFAULT_VARIANT, 8, 1024, 132, row_free=False, plain_elems=32) is None
    # no row reduction (swiglu): always spread, in either dtype
    assert shape_class_of(swiglu, "forward", {"N": 8, "H": 4096}, "float32") == "few"
    assert shape_class_of(swiglu, "backward", {"N": 8, "H": 4096}, "bfloat16") == "few"
    # rmsnorm's forward holds x and the weight: 4 chunks of 8 bf16 a thread, under 64
    assert shape_class_of(rmsnorm, "forward", {"N": 8, "D": 4096}, "bfloat16") == "medium"
    # a norm's backward sums weight gradients over rows (column partials): no split form
    assert "SG_LAUNCH_FEW" not in build_source(rmsnorm).split("// ======================= backward")[1]
    assert few_rows_tpr(DEFAULT_VARIANT, 1, 4096, 132) is None  # wider than 2048 chunks: the split schedules


def test_fewblock_gives_a_few_rows_row_one_block_of_two_chunks_a_thread():
    fewblock = _variant("fewblock")
    rmsnorm = load_spec(SPECS / "rmsnorm.yaml")
    # row reductions too (no 64-element rule): 512 chunks -> 256 threads x 2
    assert few_rows_tpr(fewblock, 8, 512, 132, row_free=False, plain_elems=32) == 256
    assert few_rows_tpr(fewblock, 8, 512, 132, row_free=False, imax=1) is None  # 2 chunks must fit the registers
    # a block per row: rows up to two waves of one block per SM (the clusters: rows x 8 blocks)
    assert few_rows_tpr(fewblock, 264, 512, 132, row_free=False) == 256
    assert few_rows_tpr(fewblock, 265, 512, 132, row_free=False) is None
    assert few_rows_tpr(DEFAULT_VARIANT, 64, 512, 132) is None
    assert shape_class_of(load_spec(SPECS / "softmax.yaml"), "forward", {"N": 64, "D": 4096}, "bfloat16",
                          _variant("fewtwo")) == "few"
    assert shape_class_of(rmsnorm, "forward", {"N": 8, "D": 4096}, "bfloat16", fewblock) == "few"
    forward = build_source(rmsnorm, fewblock).split("// ======================= backward")[0]
    assert "if (tpr == 256) SG_LAUNCH(VEC, 256, 2);" in forward and "SG_LAUNCH_FEW" not in forward
    expr = re.search(r"(?:const )?int block = (.*?);  //", forward).group(1)
    for tpr in (128, 256, 512, 1024):  # a whole block per row: never a split row's block
        assert _c_ternary(expr, {"few": 1, "tpr": tpr, "items": 2}) == tpr
    # under a medium class of 256-thread blocks (cl256) the block form stops at 256 threads
    combined = variant_named("medium:cl256+few:fewblock")
    assert few_rows_tpr(combined, 8, 512, 132, row_free=False) == 256
    assert few_rows_tpr(combined, 8, 1024, 132, row_free=False) is None


def test_the_block_form_of_few_rows_is_for_programs_with_row_reductions():
    """A program without row reductions (swiglu, cross-entropy's backward from a saved (max,
    logsum) pair) keeps the cluster of blocks, one chunk a thread, under fewblock/fewtwo; one with
    them (cross-entropy's forward) takes a block per row."""
    fewtwo = _variant("fewtwo")
    ce = load_spec(SAVED / "cross_entropy_max_logsum.yaml")
    swiglu = load_spec(SPECS / "swiglu.yaml")
    assert few_rows_tpr(fewtwo, 8, 512, 132) == 512  # row-free: 8 clusters of 8 blocks of 64
    assert few_rows_tpr(fewtwo, 8, 512, 132, row_free=False) == 256  # a block of 256, 2 chunks a thread
    forward, backward = build_source(ce, fewtwo).split("// ======================= backward")
    assert "SG_LAUNCH_FEWB(VEC, 256, 2)" in forward and "sg::launch_cluster<8>" not in forward
    assert "sg::launch_cluster<8>" in backward and "_FEWB" not in backward
    assert build_source(swiglu, fewtwo).replace("fewtwo", "default") == build_source(swiglu)
    assert shape_class_of(ce, "backward", {"N": 8, "C": 4096}, "bfloat16", fewtwo) == "few"


def test_fewtwo_gives_few_row_blocks_their_own_exact_max_then_sum_instantiation():
    """`fewtwo` (few class): few-row blocks take a max round, then a sum round (no exps in the
    merge), as their own instantiation (FEW), while the medium rows keep their (max, sum) form."""
    softmax, rmsnorm = load_spec(SPECS / "softmax.yaml"), load_spec(SPECS / "rmsnorm.yaml")
    fewtwo = _variant("fewtwo")
    assert fewtwo.few_pair == "twopass" and "few_pair" in CLASS_FIELDS["few"]
    forward, backward = build_source(softmax, fewtwo).split("// ======================= backward")
    assert "template <typename T, int VEC, int TPR, int ITEMS, int BLOCK, bool FEW = false>" in forward
    assert "if (tpr == 256) SG_LAUNCH_FEWB(VEC, 256, 2);" in forward
    assert re.search(r"#define SG_LAUNCH_FEWB\(V, P, I\) softmax_fwd_rows<T, V, P, I, P, true>", forward)
    assert re.search(r"#define SG_LAUNCH\(V, P, I\) softmax_fwd_rows<T, V, P, I, \(\(P\) > 32", forward)
    exact, rest = forward.split("if constexpr (FEW) {", 1)[1].split("} else {  // the other rows' own", 1)
    assert exact.index("sg::Max()") < exact.index("sg::Sum()") and "group_online" not in exact
    assert "group_online" in rest.split("// final pass")[0]  # the other rows: the default's merged pair
    assert "FEW" not in backward  # no (max, sum) pair there: no second instantiation
    # the medium rows on the same form already (few-row blocks are medium rows): one instantiation
    both = build_source(softmax, variant_named("medium:twopass+few:fewtwo"))
    assert "bool FEW" not in both and "if constexpr (ITEMS > 0 && TPR > 32 && TPR <= BLOCK)" in both
    # and only the medium rows: narrow and split rows in registers keep the default's own pair form
    # (each thread's exact pair, one merge round), not the online sweep
    for name in ("medium:twopass+few:fewtwo", "cl256two"):
        forward = build_source(softmax, variant_named(name)).split("// ======================= backward")[0]
        assert "} else {  // the other rows' own (max, sum) form" in forward, name
        assert "one online sweep, one reduction round" not in forward, name
    # a combination keeps each class's own pair form; no pair at all: fewblock's text
    combined = variant_named("medium:cl256+few:fewtwo")
    assert combined.few_pair == "twopass" and combined.reg_pair == "local" and combined.block_max == 256
    # its few-row blocks are not capped at cl256's 256 threads (a float32 row of 4096: 512 threads),
    # and such a block is launched whole: a 1024-thread row launched as a 256-thread split block
    # hung the verifier's B=64 D=7168 float32 case on the H200 (session 14, call 3)
    assert few_rows_tpr(combined, 8, 1024, 132, row_free=False) == 512
    assert few_rows_tpr(combined, 64, 1792, 132, row_free=False) == 1024
    forward = build_source(softmax, combined).split("// ======================= backward")[0]
    expr = re.search(r"(?:const )?int block = (.*?);  //", forward).group(1)
    for tpr in (128, 256, 512, 1024):
        assert _c_ternary(expr, {"few": 1, "tpr": tpr, "items": 2}) == tpr
    assert _c_ternary(expr, {"few": 0, "tpr": 1024, "items": 4}) == 256  # a medium row of 1024: split as before
    same = re.compile(r"// Schedule variant: .*")
    assert same.sub("", build_source(rmsnorm, fewtwo)) == same.sub("", build_source(rmsnorm, _variant("fewblock")))


def test_the_chains_variant_sums_a_streamed_row_in_one_partial_per_chunk_in_flight():
    """`chains` (wide class): each float sum of the looped pass keeps UNROLL partials, folded after
    the sweep; the default and the row held in registers are unchanged."""
    chains = _variant("chains")
    assert chains.loop_sums == "chains" and "loop_sums" in CLASS_FIELDS["wide"] and DEFAULT_VARIANT.loop_sums == "plain"
    spec = load_spec(Path(__file__).resolve().parent / "builtin_specs" / "layernorm_hw_affine.yaml")
    default, chained = build_source(spec), build_source(spec, chains)
    assert "_c[UNROLL]" not in default
    names = re.findall(r"acc_t (\w+)_c\[UNROLL\];", chained)
    assert len(set(names)) >= 3  # the forward's mean and variance, the backward's sums
    for name in set(names):
        assert re.search(rf"\b{name}_c\[u\] \+= ", chained), name
        assert f"for (int u = 0; u < UNROLL; ++u) {name} += {name}_c[u];" in chained
    # outside the looped passes the two sources are the same text
    strip = re.compile(r"^\s*(acc_t \w+_c\[UNROLL\];.*|for \(int u = 0; u < UNROLL; \+\+u\) \w+(_c\[u\] = \(acc_t\)0| \+= "
                       r"\w+_c\[u\]);|// Schedule variant: .*)$")
    kept = [line.replace("_c[u] += ", " += ") for line in chained.splitlines() if not strip.match(line)]
    assert kept == [line for line in default.splitlines() if not strip.match(line)]


def test_the_kahan_variant_compensates_each_partial_of_a_streamed_sum():
    spec = load_spec(Path(__file__).resolve().parent / "builtin_specs" / "layernorm_hw_affine.yaml")
    chains, kahan = build_source(spec, _variant("chains")), build_source(spec, _variant("kahan"))
    names = set(re.findall(r"acc_t (\w+)_c\[UNROLL\];", kahan))
    assert names == set(re.findall(r"acc_t (\w+)_c\[UNROLL\];", chains))
    for name in names:
        assert f"acc_t {name}_k[UNROLL];" in kahan and f"{name}_c[u] += " not in kahan
        assert re.search(rf"const acc_t t_ = {name}_c\[u\] \+ y_; {name}_k\[u\] = \(t_ - {name}_c\[u\]\) - y_; "
                         rf"{name}_c\[u\] = t_;", kahan), name


def test_red_form_tree_changes_only_the_row_groups_reduction_calls():
    """`red_form` "tree" (medium class): every row-group reduction call of the kernels takes its
    tree form (two barriers, every warp combining the warp values); the default's text is what it
    was (the committed kernels rebuild byte for byte: test_builtin_golden)."""
    assert "red_form" in CLASS_FIELDS["medium"] and DEFAULT_VARIANT.red_form == "serial"
    for op in ("softmax", "rmsnorm", "layernorm_gelu", "cross_entropy"):
        spec = load_spec(SPECS / f"{op}.yaml")
        serial = build_source(spec)
        tree = build_source(spec, dataclasses.replace(DEFAULT_VARIANT, red_form="tree"))
        assert "_tree<" not in serial, op
        helpers = "// ---- end of helpers ----"
        for kind in ("reduce", "reduce2", "online"):  # the calls in the kernels, not in the helpers
            calls = serial.split(helpers)[1].count(f"sg::group_{kind}<TPR, BLOCK>(")
            assert tree.count(f"sg::group_{kind}_tree<TPR, BLOCK>(") == calls, (op, kind)
        assert tree.count("__device__ __forceinline__ A group_reduce_tree(") == 1, op
        # the kernels and launchers: the same text but for those calls
        marker = "// ======================= forward"
        body = tree.split(marker, 1)[1]
        assert body.replace("_tree<TPR, BLOCK>(", "<TPR, BLOCK>(") == serial.split(marker, 1)[1], op


@pytest.mark.nvcc
@pytest.mark.slow
def test_red_form_tree_compiles_without_spills_for_softmax():
    from specgen.agents.builtin.generator import compile_source

    spec = load_spec(SPECS / "softmax.yaml")
    compiled = compile_source(spec, build_source(spec, dataclasses.replace(DEFAULT_VARIANT, red_form="tree")),
                              arch="sm_90")
    rows = {k: r for k, r in compiled.resources.items() if "_rows<" in k}
    assert rows and all(r["spill_store_bytes"] == 0 for r in rows.values())
