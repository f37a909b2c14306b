"""The axis-reduction family (builtin/families/axis_reduce.py, axis_emit.py): reductions over a
middle axis, several axes, all axes to a scalar, arg-reductions, the scalar losses.

CPU: the lowered programs run on the IR interpreter (a transposed view of the row
interpreter) against the reference and its autograd in float64, at shapes that differ from
the trace's; the layout and the kernel plan are asserted on the program, not on C text;
refusals keep the row lowering's message. nvcc: every family spec's .cu compiles. GPU: each
kernel passes specgen's verifier and repeats bit for bit.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from specgen.agents.base import AgentRefused
from specgen.agents.builtin.families import family_of
from specgen.agents.builtin.families.axis_emit import AxisEmitter
from specgen.agents.builtin.families.axis_reduce import AxisProgram, lower_axis, run_axis_program, validate
from specgen.agents.builtin.families.axis_reduce import sweeps as axis_sweeps
from specgen.agents.builtin.generator import build_source, lower_spec
from specgen.inputs import make_inputs
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent / "reduce_specs"
FAMILY = ["sum_dim1", "mean_dim1_4d", "amax_dim1", "argmax_dim1", "max_dim_last", "min_mid", "argmin_last",
          "argmax_all", "amin_all", "sum_all", "frobenius", "mean_hw_keepdim", "mse_loss", "mse_sum_3d",
          "l1_loss", "smooth_l1_loss", "huber_loss_sum", "kl_div_loss", "bce_logits_loss", "hinge_loss",
          "triplet_loss", "cosine_loss", "amax_mid_bwd", "var_mid", "softmax_mid", "sum_dims02", "amax_dims02",
          "logsumexp_mid", "std_mid", "norm_mid", "l2normalize_mid", "prod_mid", "groupnorm_affine_fwd",
          "instance_norm_affine_fwd", "recentered_std_mean", "groupnorm_film",
          "channel_stats_cat", "hw_chain_norm", "soft_argmax_mid", "flat_argmax_divmod",
          "softplus_gain_square_softmax"]
# reductions over a trailing run of axes: the row lowering's now (their trailing axes folded into
# one column axis, lower.trailing_fold); the family's own lowering of them is still tested here
FOLDED = {"mean_hw_keepdim": 2}
# losses of per-row reductions with a 0-d grad_out: the row lowering takes both directions since
# a 0-d tensor's broadcast is a global load (session 33); the family's programs still tested here
ROW_TAKEN = {"triplet_loss", "cosine_loss"}
REFUSED = {"sum_dims13": "a reduction over dims [1, 3]", "prod_mid_bwd": "prims.prod"}
SHAPES = {"N": 6, "D": 40, "B": 3, "C": 9, "L": 12, "H": 4, "W": 6, "A": 2, "G": 5, "K": 4, "V": 7}


def _spec(op):
    return load_spec(SPECS / f"{op}.yaml")


def _dims(spec):
    return {s: SHAPES[s] for s in spec.signature.symbols()}


def _alloc(ttype, dims):
    dtype = torch.float64 if ttype.is_floating else torch.int64
    return torch.full(ttype.shape(dims), -7 if dtype == torch.int64 else float("nan"), dtype=dtype)


def _forward(spec, program, args, dims):
    tensors = {p.name: args[p.name] for p in spec.signature.inputs}
    outs = {o.name: _alloc(o.type, dims) for o in spec.signature.outputs}
    run_axis_program(program, tensors, {}, dims, outs)
    return outs


def _programs(op):
    """The family's programs for `op` (lower_axis directly for the ops the row lowering takes)."""
    return lower_axis(_spec(op)) if op in FOLDED or op in ROW_TAKEN else lower_spec(_spec(op))


def _expected(spec, args):
    got = spec.reference_fn()(**args)
    return got if isinstance(got, (tuple, list)) else (got,)


@pytest.mark.parametrize("op", FAMILY)
def test_forward_matches_reference(op):
    spec = _spec(op)
    programs = _programs(op)
    assert family_of(programs) is not None and all(isinstance(p, AxisProgram) for p in programs.values())
    dims = _dims(spec)
    args = make_inputs(spec.signature, dims, "float64", seed=3)
    outs = _forward(spec, programs["forward"], args, dims)
    for o, want in zip(spec.signature.outputs, _expected(spec, args)):
        if want.dtype == torch.int64:
            assert torch.equal(outs[o.name], want.reshape(outs[o.name].shape))
        else:
            torch.testing.assert_close(outs[o.name], want.double().reshape(outs[o.name].shape), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("op", [op for op in FAMILY if load_spec(SPECS / f"{op}.yaml").backward == "kernel"])
def test_backward_matches_autograd(op):
    spec = _spec(op)
    sig = spec.signature
    dims = _dims(spec)
    args = make_inputs(sig, dims, "float64", seed=4)
    leaves = {k: (v.clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for k, v in args.items()}
    result = _expected(spec, leaves)
    gen = torch.Generator().manual_seed(5)
    grads = {f"grad_{o.name}": torch.randn(r.shape, generator=gen, dtype=torch.float64)
             for o, r in zip(sig.outputs, result) if o.type.is_floating}
    floating = [p.name for p in sig.inputs if p.type.is_floating]
    diff = [(r, grads[f"grad_{o.name}"]) for o, r in zip(sig.outputs, result) if o.type.is_floating]
    expected = torch.autograd.grad([r for r, _ in diff], [leaves[n] for n in floating], [g for _, g in diff],
                                   allow_unused=True)
    program = _programs(op)["backward"]
    tensors = {p.name: args[p.name] for p in sig.inputs} | {o.name: r.detach() for o, r in zip(sig.outputs, result)} \
        | grads
    outs = {f"grad_{n}": torch.full(args[n].shape, float("nan"), dtype=torch.float64) for n in floating}
    run_axis_program(program, tensors, {}, dims, outs)
    for n, want in zip(floating, expected):
        want = torch.zeros_like(args[n]) if want is None else want
        torch.testing.assert_close(outs[f"grad_{n}"], want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("op", ["argmax_dim1", "max_dim_last", "min_mid", "argmin_last", "argmax_all"])
def test_arg_reductions_break_ties_and_nans_as_torch(op):
    spec = _spec(op)
    dims = _dims(spec)
    x = torch.randint(-2, 3, spec.signature.inputs[0].type.shape(dims), generator=torch.Generator().manual_seed(1)
                      ).double()  # many ties
    flat = x.view(-1)
    flat[5] = float("nan")
    flat[17] = float("nan")
    flat[30] = float("inf")
    outs = _forward(spec, lower_spec(spec)["forward"], {"x": x}, dims)
    for o, want in zip(spec.signature.outputs, _expected(spec, {"x": x})):
        torch.testing.assert_close(outs[o.name], want.to(outs[o.name].dtype).reshape(outs[o.name].shape),
                                   rtol=0, atol=0, equal_nan=True)


def test_losses_of_row_reductions_are_row_programs():
    for op in sorted(ROW_TAKEN):
        programs = lower_spec(_spec(op))
        assert set(programs) == {"forward", "backward"} and not any(isinstance(p, AxisProgram)
                                                                    for p in programs.values())
        loads = [n for n in programs["backward"].nodes() if n.op == "load" and n.attrs["field"] == "grad_out"]
        assert loads and all(n.attrs["kind"] == "global" for n in loads)


def test_layouts_and_plans():
    def plan(op, direction="forward"):
        spec = _spec(op)
        program = _programs(op)[direction]
        return program.layout.describe(), AxisEmitter(spec, program, direction).plan()

    assert plan("mean_dim1_4d")[0] == "O = B, R = C, I = H * W"
    assert plan("mean_hw_keepdim")[0] == "O = B * C, R = H * W, I = 1"
    assert plan("sum_all")[0] == "O = 1, R = B * C * L, I = 1"
    assert plan("sum_dims02")[0] == "O = C, R = B x L (both ends), I = 1"
    layout, p = plan("max_dim_last")
    # torch.max's values come from its argmax's running value: one reduction
    assert layout == "O = N, R = D, I = 1" and p["kinds"] == ["argmax"] and not p["elem"]
    assert p["values_from_arg"] == ["argmax"] and p["partial_slots"] == 2
    # backward of a mean over channels: no reduction, a pass over S reading grad_out per kept element
    _, p = plan("mean_dim1_4d", "backward")
    assert not p["reduce"] and p["elem"] and p["kept_slots"] == 0
    # backward of torch.max: the forward's indices read back (no second sweep), the scatter pass
    spec = _spec("max_dim_last")
    _, p = plan("max_dim_last", "backward")
    assert not p["reduce"] and p["elem"]
    loads = {n.attrs["field"]: n.level for n in lower_spec(spec)["backward"].nodes() if n.op == "load"}
    assert loads == {"out1": "row", "grad_out0": "row"}
    _, p = plan("mse_loss")
    assert p["kinds"] == ["sum"] and p["partial_slots"] == 1 and not p["totals"]
    # triplet margin loss: two row norms per kept row, then the mean over rows (a total); each
    # norm's sweep also keeps max |d|, the norm of a lone column (optimize.lone_norms)
    layout, p = plan("triplet_loss")
    assert layout == "O = N, R = D, I = 1" and p["kinds"] == ["max", "sum", "max", "sum"] and p["totals"] == 1
    assert p["phases"] == [["max", "sum", "max", "sum"]]  # one sweep still
    # dependent sweeps: a variance (the mean, then the squared deviations), a softmax over channels
    assert plan("var_mid")[1]["phases"] == [["sum"], ["sum"]]
    # a concatenation of keepdim reductions along their size-1 axis: each kept value stored into
    # its piece of the output, and the backward reads each piece of grad_out per kept element
    programs = lower_spec(_spec("channel_stats_cat"))
    assert [(s.kind, s.piece) for s in programs["forward"].stores] == [("piece", (1, k, 3)) for k in range(3)]
    assert sorted(n.attrs["piece"] for n in programs["backward"].nodes()
                  if n.op == "load" and n.attrs["kind"] == "piece") == [(1, k, 3) for k in range(3)]
    # torch.arange along the reduced axis: each element's coordinate there, a part value with no
    # tensor behind it (torch traces arange(1, 2 * D + 1, 2) as an iota from 0, times 2, plus 1)
    program = lower_spec(_spec("soft_argmax_mid"))["forward"]
    aranges = [n.attrs for n in program.nodes() if n.op == "load" and n.attrs.get("arange")]
    assert [(a["kind"], a["atoms"], a["arange"]) for a in aranges] == [("part", (1,), (0, 1))]
    # a head's gain through softplus: its gradient a part total over every atom but H, whose
    # epilogue reads g at the output element (softplus's derivative)
    stores = {s.field: s.kind for s in lower_spec(_spec("softplus_gain_square_softmax"))["backward"].stores}
    assert stores == {"grad_x": "elem", "grad_g": "part"}
    # chains of keepdim reductions (over W, then H) are one reduction over the block (H, W)
    layout, p = plan("hw_chain_norm")
    assert layout == "O = B * C, R = H * W, I = 1" and p["phases"] == [["sum"], ["sum"]]
    # four dependent sweeps in a backward (a std of values already centered by their mean: torch
    # takes the mean again; each step reads the one before)
    assert axis_sweeps(lower_axis(_spec("recentered_std_mean"))["backward"]) == 4
    layout, p = plan("softmax_mid")
    assert layout == "O = B, R = C, I = L" and p["phases"] == [["max"], ["sum"]] and p["elem"]
    assert p["kept_slots"] == 2  # the max and the sum, read by the elem pass
    # softmax's backward reads its forward output: out * (g - sum(g * out)), one sweep, no exp
    program = lower_spec(_spec("softmax_mid"))["backward"]
    assert [n.attrs["kind"] for n in program.nodes() if n.op == "rowreduce"] == ["sum"]
    assert not any(n.op == "exp" for n in program.nodes())
    # the backward of amax: the forward's max read back, one sweep counting its ties, then the pass
    assert plan("amax_mid_bwd", "backward")[1]["phases"] == [["sum"]]
    # GroupNorm's weight and bias [4*G] vary along its block (G of [B, 4, G, L]): read per element
    # at its coordinates in the atoms (4, G), not per kept row and not as S
    layout, p = plan("groupnorm_affine_fwd")
    assert layout == "O = B * 4, R = G * L, I = 1"
    program = lower_spec(_spec("groupnorm_affine_fwd"))["forward"]
    parts = {n.attrs["field"]: n.attrs["atoms"] for n in program.nodes() if n.op == "load" and n.attrs["kind"] == "part"}
    assert parts == {"weight": (1, 2), "bias": (1, 2)}
    # a FiLM after it: gamma's and beta's gradients [B, 4*G] are sums over L alone, returned as
    # they are: part totals per (sample, group, channel), beside the weight's over B and L
    stores = {s.field: (s.kind, s.value.attrs.get("atoms")) for s in lower_spec(_spec("groupnorm_film"))["backward"].stores}
    assert stores == {"grad_x": ("elem", None), "grad_weight": ("part", (1, 2)), "grad_bias": ("part", (1, 2)),
                      "grad_gamma": ("part", (0, 1, 2)), "grad_beta": ("part", (0, 1, 2))}


def test_programs_validate_and_the_row_family_keeps_its_ops():
    for op in FAMILY:
        for program in lower_axis(_spec(op)).values():
            validate(program)
    # ops the row lowering takes stay there (sum over the leading dims: a column reduction; a
    # reduction over trailing axes: one folded column axis)
    assert family_of(lower_spec(_spec("sum_lead2"))) is None
    for op, fold in FOLDED.items():
        programs = lower_spec(_spec(op))
        assert family_of(programs) is None and programs["forward"].fold == fold


@pytest.mark.parametrize("op", sorted(REFUSED))
def test_outside_the_families_keeps_the_row_refusal(op):
    spec = _spec(op)
    with pytest.raises(AgentRefused) as info:
        build_source(spec)
    message = str(info.value)
    assert f"{op}.yaml:" in message and "LLM agent" in message and "--agent" in message
    assert REFUSED[op] in message


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("op", ["sum_dim1", "max_dim_last", "mse_loss", "mean_hw_keepdim", "triplet_loss",
                                "softmax_mid", "amax_dims02", "groupnorm_affine_fwd",
                                "recentered_std_mean", "channel_stats_cat"])
def test_family_sources_compile(op):
    from specgen.agents.builtin.generator import compile_source

    spec = _spec(op)
    compile_source(spec, build_source(spec))


# one of each kind of kernel (middle axis, keepdim, arg, values + indices, scalar, loss with a
# total, phases, both ends, backward through ties); the rest run with -m slow
GPU_CORE = ["sum_dim1", "mean_dim1_4d", "argmax_dim1", "max_dim_last", "min_mid", "sum_all", "mse_loss",
            "mean_hw_keepdim", "cosine_loss", "softmax_mid", "sum_dims02", "amax_mid_bwd", "groupnorm_affine_fwd",
            # session 40, not yet run on a GPU: four sweeps, a part total returned, pieces of a concatenation
            "recentered_std_mean", "groupnorm_film", "channel_stats_cat", "hw_chain_norm",
            "soft_argmax_mid", "flat_argmax_divmod", "softplus_gain_square_softmax"]


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("op", [op if op in GPU_CORE else pytest.param(op, marks=pytest.mark.slow) for op in FAMILY])
def test_family_kernels_verify_on_the_gpu(op):
    from specgen.verify import verify_kernel

    spec = _spec(op)
    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("op,dims", [("sum_all", {"B": 64, "C": 1024, "L": 4099}),
                                     ("sum_dim1", {"B": 3, "C": 4096, "L": 5}),
                                     ("mse_loss", {"N": 4097, "D": 1031})])
def test_split_reductions_are_bit_reproducible(op, dims):
    """Split over many blocks (a workspace and a combine pass): the same bits every run."""
    from specgen import abi
    from specgen.agents.builtin.generator import compile_source
    import ctypes

    spec = _spec(op)
    compiled = compile_source(spec, build_source(spec))
    lib = ctypes.CDLL(str(compiled.library))
    fn = getattr(lib, abi.entry_point(spec, "forward"))
    size = getattr(lib, abi.workspace_function(spec, "forward"))
    size.restype = ctypes.c_size_t
    args = make_inputs(spec.signature, dims, "float32", seed=0, device="cuda")
    results = []
    for _ in range(3):
        outs = {o.name: torch.empty(o.type.shape(dims), device="cuda",
                                    dtype=torch.float32 if o.type.is_floating else torch.int64)
                for o in spec.signature.outputs}
        struct = abi.pack_args(spec, "forward", {**args, **outs}, {}, dims)
        workspace = torch.empty(size(ctypes.byref(struct)), dtype=torch.uint8, device="cuda")
        abi.set_workspace(struct, workspace)
        assert fn(ctypes.byref(struct), None) == 0
        torch.cuda.synchronize()
        results.append([outs[o.name].cpu() for o in spec.signature.outputs])
    for other in results[1:]:
        assert all(torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                               b.view(torch.int32) if b.is_floating_point() else b) for a, b in zip(results[0], other))


def test_family_source_is_the_same_in_any_process_state():
    """Kernels are committed: lowering other ops first (process-wide node ids) must not change
    a family kernel's text."""
    from specgen.agents.builtin import generator

    spec = _spec("softmax_mid")
    first = build_source(spec)
    generator._programs.clear()
    build_source(_spec("cosine_loss"))
    generator._programs.clear()
    assert build_source(spec) == first


def test_launch_plan_spreads_every_shape_over_the_sms():
    """The host's geometry (mirrored by launch_plan): a scalar reduction is split into many
    chunks, a middle axis with a wide kept axis reads 16 bytes a thread along it, a narrow one
    splits R, a last-axis reduction reads 16 bytes along R."""
    from specgen.agents.builtin.families.axis_emit import launch_plan

    total = launch_plan(1, 4096 * 4096, 1, 4)  # x.sum() of 16M floats
    assert total["TX"] == 1 and total["vec_r"] and total["G"] == 2048
    assert total["chunk"] % (256 * 4) == 0 and total["G"] * total["chunk"] >= 4096 * 4096
    mid = launch_plan(16, 256, 4096, 2)  # sum over C of [16, 256, 4096] bf16
    assert (mid["TX"], mid["VI"], mid["G"], mid["chunk"]) == (32, 8, 8, 32)  # 2048 blocks, 4 steps a thread
    narrow = launch_plan(3, 4096, 5, 4)  # few kept elements: R split
    assert narrow["TX"] == 4 and narrow["VI"] == 1 and narrow["G"] > 1
    rows = launch_plan(4096, 4096, 1, 4)  # torch.max over the last dim: a block per row
    assert rows["vec_r"] and rows["G"] == 1
    odd = launch_plan(5, 1001, 7, 4, aligned=False)
    assert odd["VI"] == 1 and not odd["vec_r"] and odd["G"] * odd["chunk"] >= 1001
    # the `axisrows` variant: a warp per kept element where R is short and no split is needed
    assert not rows["rows"] and launch_plan(262144, 4096, 1, 4, rows_max=16384)["rows"]
    assert not launch_plan(262144, 32768, 1, 4, rows_max=16384)["rows"]  # R too long for a warp
    assert not launch_plan(8, 4096, 1, 4, rows_max=16384)["rows"]  # decode: a block a row, loads all in flight
    assert not launch_plan(4096, 256, 16, 4, rows_max=16384)["rows"]  # a kept inner axis


def test_torch_max_values_come_from_the_argmax_not_a_second_reduction():
    spec = load_spec(Path(__file__).resolve().parent.parent / "benchmarks" / "level1" / "specs"
                     / "max_with_indices.yaml")
    emitter = AxisEmitter(spec, lower_spec(spec)["forward"], "forward")
    assert [n.attrs["kind"] for n in emitter.reduces] == ["argmax"]  # one reduction sweeps the row
    (values, arg), = emitter.aliases.items()
    assert arg is emitter.reduces[0]
    assert [s.field for s in emitter.row_stores if s.value.id == values] == ["values"]
    # an argmax alone, or a max alone, has nothing to pair
    for name in ("argmin_last", "amax_dim1"):
        other = load_spec(Path(__file__).resolve().parent.parent / "benchmarks" / "level1" / "specs" / f"{name}.yaml")
        assert AxisEmitter(other, lower_spec(other)["forward"], "forward").aliases == {}


@pytest.mark.nvcc
def test_the_warp_per_row_variant_compiles_without_spills_and_dispatches_on_short_rows():
    from specgen.agents.builtin.generator import compile_source
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(Path(__file__).resolve().parent.parent / "benchmarks" / "level1" / "specs"
                     / "amax_rows_indices.yaml")
    source = build_source(spec, variants_named("axisrows")[0])
    assert "_rows0" not in build_source(spec)  # the default keeps the block per row
    assert "if (I == 1 && O >= 2048 && R <= 16384) {" in source
    kernels = {k: r for k, r in compile_source(spec, source).resources.items() if "_rows0<" in k}
    assert len(kernels) == 4 and all(r["spill_store_bytes"] == 0 and r["shared_bytes"] == 0 for r in kernels.values())


def test_a_functional_copy_keeps_normalize_in_the_row_family():
    """F.normalize's backward copies into a fresh tensor (aten.copy_): the row lowering takes
    it as the source's value, so the op stays a row program (one read of a row in registers)."""
    from specgen.agents.builtin.interp import run_program

    spec = _spec("l2normalize_last")
    programs = lower_spec(spec)
    assert family_of(programs) is None
    dims = {"N": 6, "D": 40}
    x = torch.randn(6, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    out = torch.nn.functional.normalize(x, dim=-1)
    g = torch.randn(6, 40, dtype=torch.float64)
    (want,) = torch.autograd.grad(out, x, g)
    got = {"grad_x": torch.full((6, 40), float("nan"), dtype=torch.float64)}
    run_program(programs["backward"], {"x": x.detach(), "out": out.detach(), "grad_out": g}, {}, dims, got)
    torch.testing.assert_close(got["grad_x"], want, rtol=1e-9, atol=1e-9)


def test_a_backward_reads_the_norm_the_forward_stored_instead_of_sweeping_again():
    """frobenius_norm's backward, x / norm * grad: the forward's float32 output is the norm
    exactly, so the backward reads it (one pass over x, not three: 0.53-0.65x torch.compile
    at 6-13 GB on the H200 when it swept x again for the norm)."""
    from specgen.agents.builtin.families.axis_reduce import _stored_exactly
    from specgen.agents.builtin.ir import Node

    level1 = Path(__file__).resolve().parent.parent / "benchmarks" / "level1" / "specs"
    spec = load_spec(level1 / "frobenius_norm.yaml")
    backward = lower_spec(spec)["backward"]
    assert not [n for n in backward.nodes() if n.op == "rowreduce"]
    assert [n.attrs["field"] for n in backward.nodes() if n.op == "load" and n.attrs["kind"] == "row"] == ["out"]
    out = spec.signature.outputs[0].type
    norm = Node("sqrt", (Node("rowreduce", (), level="row", dtype="float", attrs={"kind": "sum"}),),
                level="row", dtype="float")
    assert _stored_exactly(spec, out, norm)  # float32 output, float32 math
    as_f64 = spec.model_copy(update={"dtypes": ["float32", "float64"]})
    assert not _stored_exactly(as_f64, out, norm)  # float64 math rounded to a float32 output


def test_one_element_a_group_reads_the_input_as_s_not_as_kept_values():
    """GroupNorm with G = L = 1: S and the kept shape have the same numel (R == 1); the CPU
    interpreter took x for a kept tensor and raised IndexError (a helper's fuzz, session 21)."""
    from builtin_support import check_forward

    check_forward(_spec("groupnorm_affine_fwd"), {"B": 2, "G": 1, "L": 1})
    check_forward(_spec("groupnorm_affine_fwd"), {"B": 3, "G": 2, "L": 1})


LEVEL1 = Path(__file__).resolve().parent.parent / "benchmarks" / "level1" / "specs"
# rows (I == 1): an elem pass after two phases (the norms), one phase with row stores (max / argmin)
FUSED_OPS = {"instance_norm": LEVEL1, "groupnorm_affine_fwd": SPECS, "instance_norm_affine_fwd": SPECS,
             "max_dim_last": SPECS, "argmin_last": SPECS}


def _fused_plan(spec, direction, variant_name):
    from specgen.agents.builtin.schedule import variants_named

    variant = variants_named(variant_name)[0] if variant_name else None
    program = (lower_axis(spec) if spec.name in ROW_TAKEN else lower_spec(spec))[direction]
    return (AxisEmitter(spec, program, direction, variant) if variant else AxisEmitter(spec, program, direction)).plan()


def test_the_fused_variant_runs_every_phase_of_a_row_in_one_block():
    """`axisfused`: one kernel a block per kept element for programs with reductions and no
    total; the default keeps the reduce / elem kernels; a loss (a total over all rows) and a
    two-ended layout keep them under the variant too."""
    norm = load_spec(LEVEL1 / "instance_norm.yaml")
    for direction in ("forward", "backward"):
        fused = _fused_plan(norm, direction, "axisfused")
        assert fused["fused"] and fused["elem"] and len(fused["phases"]) >= 2
        assert not _fused_plan(norm, direction, None)["fused"]
    assert not _fused_plan(_spec("cosine_loss"), "forward", "axisfused")["fused"]  # its total
    assert not _fused_plan(_spec("sum_dims02"), "forward", "axisfused")["fused"]  # both ends


@pytest.mark.nvcc
def test_the_fused_variant_compiles_without_spills():
    from specgen.agents.builtin.generator import compile_source
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(LEVEL1 / "instance_norm.yaml")
    source = build_source(spec, variants_named("axisfused")[0])
    assert "_fused<" not in build_source(spec)
    kernels = {k: r for k, r in compile_source(spec, source).resources.items() if "_fused<" in k}
    # forward and backward, float32 and bfloat16: VEC for both passes, for the sweeps only, none
    assert len(kernels) == 12 and all(r["spill_store_bytes"] == 0 for r in kernels.values())


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("op", list(FUSED_OPS))
def test_fused_variant_kernels_verify_on_the_gpu(op):
    from specgen.agents.builtin.schedule import variants_named
    from specgen.verify import verify_kernel

    spec = load_spec(FUSED_OPS[op] / f"{op}.yaml")
    source = build_source(spec, variants_named("axisfused")[0])
    assert source != build_source(spec)
    verdict = verify_kernel(spec, source)
    assert verdict.passed, verdict.summary()


def test_the_moments_variant_sweeps_a_variance_with_its_mean():
    """`moments` on axis programs: InstanceNorm's, GroupNorm's and BatchNorm's sum of squared
    deviations from sum(x) / count joins the sum's phase (one read of x fewer), and in the
    backward sum(g * (x - mean)) too (a co-moment); other programs keep their phases."""
    cases = [(load_spec(LEVEL1 / "instance_norm.yaml"), "forward", 1),
             (_spec("groupnorm_affine_fwd"), "forward", 1),
             (load_spec(LEVEL1 / "batchnorm1d_train_ncl.yaml"), "forward", 1)]
    for spec, direction, pairs in cases:
        default = _fused_plan(spec, direction, None)
        mom = _fused_plan(spec, direction, "moments")
        assert default["moments"] == 0 and mom["moments"] == pairs
        assert len(mom["phases"]) == len(default["phases"]) - 1
        assert mom["partial_slots"] == default["partial_slots"] + 1  # the pair's count
    for op in ("cosine_loss", "max_dim_last", "sum_dims02"):
        assert _fused_plan(_spec(op), "forward", "moments")["moments"] == 0
    # the backward's sum(g * (x - mean)) is a co-moment of the same sweep: one phase, not two
    for spec in (load_spec(LEVEL1 / "instance_norm.yaml"), load_spec(LEVEL1 / "batchnorm1d_train_ncl.yaml")):
        default, mom = _fused_plan(spec, "backward", None), _fused_plan(spec, "backward", "moments")
        assert (len(default["phases"]), len(mom["phases"])) == (2, 1)
        assert mom["moments"] == mom["co_moments"] == 1 and default["co_moments"] == 0


def test_moments_pairs_need_the_reduced_count():
    """A mean over another count (sum(x) / H where the reduction runs over H * W) is not the mean
    the merged moments give: no pair."""
    from specgen.agents.builtin.families import axis_emit
    from specgen.agents.builtin.ir import Node
    from specgen.signature import Dim

    h, w = (Node("dim", level="global", dtype="int", attrs={"dim": Dim("H")}),
            Node("dim", level="global", dtype="int", attrs={"dim": Dim("W")}))
    both = Node("cast", (Node("mul", (h, w), level="global", dtype="int"),), level="global")
    assert axis_emit._dims_of_count(both) == sorted([str(Dim("H")), str(Dim("W"))])
    assert axis_emit._dims_of_count(Node("cast", (h,), level="global")) == [str(Dim("H"))]
    assert axis_emit._dims_of_count(Node("const", level="const", attrs={"value": 4})) is None


def test_the_elem_vec_variant_takes_odd_kept_axes_16_bytes_at_a_time():
    """`axiselemvec`: a backward's elem pass over a kept axis VEC does not divide (sum over dim 1
    of [64, 4096, 4095], the development suite's odd shape) takes MODE 3 (VEC flat elements a
    thread, each at its own position) where the default takes MODE 0 (one element a thread);
    shapes the vector modes already take keep them; the forward (no elem pass) is unchanged."""
    from specgen.agents.builtin.families.axis_emit import elem_mode

    spec = load_spec(LEVEL1 / "sum_dim1_keepdim.yaml")
    assert _fused_plan(spec, "backward", "axiselemvec")["elem_vec"]
    assert not _fused_plan(spec, "backward", None)["elem_vec"]
    assert not _fused_plan(spec, "forward", "axiselemvec")["elem_vec"]
    for itemsize in (4, 2):
        assert elem_mode(64, 4096, 4095, itemsize) == 0
        assert elem_mode(64, 4096, 4095, itemsize, elem_vec=True) == 3
        assert elem_mode(16, 4096, 16384, itemsize, elem_vec=True) == 1  # I % VEC == 0
        assert elem_mode(64, 4096, 1, itemsize, elem_vec=True) == 2  # along R
        assert elem_mode(3, 5, 7, itemsize, elem_vec=True) == 0  # N % VEC != 0: one at a time
        assert elem_mode(8, 64, 1, itemsize, ends_rb=4095, elem_vec=True) == 3


MOMENTS_SPECS = Path(__file__).resolve().parent / "moments_specs"


@pytest.mark.parametrize("op", ["two_norms", "phase", "corr3"])
def test_a_sum_is_swept_by_one_moments_pair_at_most(op):
    """A review's cases (session 24): two pairs sharing one sum(g) (two InstanceNorms of one
    grad), a sum(y) that is another pair's own sum, and a pair after a max whose sum(g) sits in
    an earlier phase. Each sum belongs to one pair or none, and every source builds."""
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(MOMENTS_SPECS / f"{op}.yaml")
    variant = variants_named("moments")[0]
    for direction, program in lower_spec(spec).items():
        em = AxisEmitter(spec, program, direction, variant)
        swept = [s1.id for s1, _ in em.pairs.values()] + [sg.id for _, sg in em.co.values()]
        assert len(swept) == len(set(swept))
        for s2, (s3, sg) in em.co.items():
            phase_of = {n.id: p for p, ns in enumerate(em.phases) for n in ns}
            assert phase_of[sg.id] == phase_of[em.pairs[s2][0].id] == phase_of[s3.id]
    assert "sg::moments_merge(" in build_source(spec, variant)


@pytest.mark.nvcc
def test_the_moments_variants_compile_without_spills():
    from specgen.agents.builtin.generator import compile_source
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(LEVEL1 / "instance_norm.yaml")
    for name in ("moments", "axisfusedmom"):
        source = build_source(spec, variants_named(name)[0])
        assert "sg::moments_merge(" in source and "sg::moments_merge(" not in build_source(spec)
        # the kernels that sweep a pair (phase 0's reduce and combine, the fused one): no spills
        swept = {k: r for k, r in compile_source(spec, source).resources.items()
                 if any(part in k for part in ("_reduce0<", "_combine0<", "_fused<"))}
        # (bfloat16's backward at TX = 32 without VI spills 4 bytes under the co-moment's five values)
        assert len(swept) >= 8 and all(r["spill_store_bytes"] <= 4 for r in swept.values()), (name, swept)
        assert all(r["spill_store_bytes"] == 0 for k, r in swept.items() if "_fwd_" in k or "_fused<" in k), name


MOMENTS_OPS = {"instance_norm": LEVEL1, "groupnorm_affine_fwd": SPECS, "batchnorm1d_train_ncl": LEVEL1}


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("variant", ["moments", "axisfusedmom"])
@pytest.mark.parametrize("op", list(MOMENTS_OPS))
def test_moments_variant_kernels_verify_on_the_gpu(op, variant):
    from specgen.agents.builtin.schedule import variants_named
    from specgen.verify import verify_kernel

    spec = load_spec(MOMENTS_OPS[op] / f"{op}.yaml")
    source = build_source(spec, variants_named(variant)[0])
    assert "sg::moments_merge(" in source
    verdict = verify_kernel(spec, source)
    assert verdict.passed, verdict.summary()


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("op,dims", [("sum_dim1", {"B": 3, "C": 8, "L": 4095}),  # I = 4095: MODE 3
                                     ("sum_dim02", {"A": 3, "B": 8, "C": 4095})])  # both ends, RB = 4095
def test_elem_vec_backward_matches_the_reference_at_odd_kept_axes(op, dims):
    """The backward's elem pass in MODE 3 (variant axiselemvec) at a shape that takes it, float32
    and bfloat16, against torch's own backward of the reference (a sum's: grad_out broadcast, so
    exact); the default (MODE 0) too."""
    import ctypes

    from specgen import abi
    from specgen.agents.builtin.families.axis_emit import elem_mode
    from specgen.agents.builtin.generator import compile_source
    from specgen.agents.builtin.schedule import variants_named

    spec = _spec(op) if op == "sum_dim1" else load_spec(LEVEL1 / f"{op}.yaml")
    x_shape = spec.signature.inputs[0].type.shape(dims)
    for itemsize in (4, 2):  # N % VEC == 0 for float32 and bfloat16: MODE 3, not MODE 0
        assert elem_mode(1, 1, math.prod(x_shape), itemsize, elem_vec=True) == 1
    for variant in (variants_named("axiselemvec")[0], None):
        source = build_source(spec, variant) if variant else build_source(spec)
        lib = ctypes.CDLL(str(compile_source(spec, source).library))
        fn = getattr(lib, abi.entry_point(spec, "backward"))
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(x_shape, device="cuda").to(dtype)
            out = spec.reference_fn()(x=x)
            grad_out = torch.randn_like(out)
            xd = x.double().requires_grad_()
            (spec.reference_fn()(x=xd) * grad_out.double()).sum().backward()
            truth = xd.grad
            grad_x = torch.full(x_shape, float("nan"), device="cuda", dtype=dtype)
            struct = abi.pack_args(spec, "backward", {"x": x, "out": out, "grad_out": grad_out, "grad_x": grad_x},
                                   {}, dims)
            size = getattr(lib, abi.workspace_function(spec, "backward"), None)
            if size is not None:
                size.restype = ctypes.c_size_t
                workspace = torch.empty(size(ctypes.byref(struct)), dtype=torch.uint8, device="cuda")
                abi.set_workspace(struct, workspace)
            assert fn(ctypes.byref(struct), None) == 0
            torch.cuda.synchronize()
            assert torch.equal(grad_x.double(), truth), (op, variant, dtype)  # a sum's backward: a broadcast


@pytest.mark.gpu
@pytest.mark.nvcc
def test_fused_kernel_strides_over_rows_and_stores_unaligned_alike():
    """The fused kernel with more rows than blocks (O = 4096 rows of 16 KB: the 24 MB cap gives
    1536 blocks, so blocks take 2-3 rows and reuse their shared memory), against the float64
    reference; an output one element off 16 bytes (the elem pass one element at a time, the
    sweeps still 16 bytes wide) gives the same bits."""
    import ctypes

    from specgen import abi
    from specgen.agents.builtin.generator import compile_source
    from specgen.agents.builtin.schedule import variants_named

    spec = load_spec(LEVEL1 / "instance_norm.yaml")
    lib = ctypes.CDLL(str(compile_source(spec, build_source(spec, variants_named("axisfused")[0])).library))
    fn = getattr(lib, abi.entry_point(spec, "forward"))
    size = getattr(lib, abi.workspace_function(spec, "forward"))
    size.restype = ctypes.c_size_t
    dims = {"B": 64, "C": 64, "H": 64, "W": 64}
    x = make_inputs(spec.signature, dims, "float32", seed=1, device="cuda")["x"]
    outs = []
    for offset in (0, 1):
        out = torch.full((x.numel() + offset,), float("nan"), device="cuda")[offset:].view(x.shape)
        struct = abi.pack_args(spec, "forward", {"x": x, "out": out}, {}, dims)
        workspace = torch.empty(size(ctypes.byref(struct)), dtype=torch.uint8, device="cuda")
        abi.set_workspace(struct, workspace)
        assert fn(ctypes.byref(struct), None) == 0
        torch.cuda.synchronize()
        outs.append(out.cpu())
    truth = spec.reference_fn()(x=x.double().cpu())
    assert torch.allclose(outs[0].double(), truth, atol=1e-4, rtol=1e-4)
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))


def test_groupnorm_centres_before_scaling_so_one_element_groups_are_exact():
    """torch's decomposition writes GroupNorm as x * (rstd * w) + (b - mean * rstd * w); with one
    value a group (variance 0, rstd = 316) the products cancel, and every kernel variant was
    1.4-3e-5 off on the H200 (session 23). optimize.centered_affine keeps (x - mean) * a + b:
    the float32 interpreter (the kernels' accumulator) then gives b exactly; the folded form
    gave 2.3e-5 here."""
    spec = _spec("groupnorm_affine_fwd")
    program = lower_spec(spec)["forward"]
    assert any(n.op == "isfinite" for n in program.nodes())  # the centred form, guarded
    dims = {"B": 5, "G": 1, "L": 1}
    worst = 0.0
    for seed in range(10):
        args = make_inputs(spec.signature, dims, "float32", seed=seed)
        out = torch.full((5, 4, 1), float("nan"), dtype=torch.float32)
        run_axis_program(program, dict(args), {}, dims, {"out": out}, acc=torch.float32)
        truth = spec.reference_fn()(**{k: v.double() for k, v in args.items()})
        worst = max(worst, (out.double() - truth).abs().max().item())
    assert worst < 1e-9


def test_groupnorm_keeps_the_references_nan_where_an_infinite_weight_cancels():
    """With w = inf at a channel, torch's folded form gives x * inf + (b - mean * inf): NaN where
    x and the mean have one sign, while the centred form alone gives +-inf (the H200's specials,
    session 24). The guarded form keeps the reference's value at every element."""
    spec = _spec("groupnorm_affine_fwd")
    program = lower_spec(spec)["forward"]
    dims = {"B": 3, "G": 8, "L": 3}
    args = make_inputs(spec.signature, dims, "float32", seed=3)
    args["x"] = args["x"].abs() + 0.5  # one sign: every x * inf and mean * inf is +inf
    args["weight"][5] = float("inf")
    out = torch.zeros((3, 32, 3), dtype=torch.float32)
    run_axis_program(program, dict(args), {}, dims, {"out": out}, acc=torch.float32)
    truth = spec.reference_fn()(**{k: v.double() for k, v in args.items()})
    assert truth[:, 5].isnan().any()  # the case: the reference's own NaN
    assert torch.equal(out.isnan(), truth.isnan()) and torch.equal(out.isinf(), truth.isinf())
    finite = truth.isfinite()
    assert torch.allclose(out.double()[finite], truth[finite], atol=1e-4, rtol=1e-4)
