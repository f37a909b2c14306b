"""Reductions over several axes through views (builtin/families/axis_views.py): LayerNorm over
trailing dims, GroupNorm (channels split into groups), InstanceNorm (batch and channels
merged), BatchNorm in training mode (both ends), norms and moments over several dims.

CPU: the lowered programs run on the IR interpreter against the reference and its autograd in
float64, at shapes that differ from the trace's (another G, so a split channel dim must follow
it); the atoms and layouts are asserted; views that mix axes are refused. nvcc: the .cu of each
level-1 normalization compiles."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specgen.agents.base import AgentRefused
from specgen.agents.builtin.families import family_of
from specgen.agents.builtin.families.axis_reduce import AxisProgram, lower_axis, run_axis_program
from specgen.agents.builtin.families.axis_views import match, refine
from specgen.agents.builtin.generator import build_source, lower_spec
from specgen.inputs import make_inputs
from specgen.signature import Dim
from specgen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = {p.stem: p for p in (ROOT / "tests" / "reduce_specs").glob("*.yaml")} | \
    {p.stem: p for p in (ROOT / "benchmarks" / "level1" / "specs").glob("*.yaml")}
NORMS = ["layernorm_module", "groupnorm_module", "instance_norm", "batchnorm_train_module"]
VIEWS = NORMS + ["layernorm_last2", "groupnorm_3d", "batchnorm_train_3d", "instance_norm_1d", "group_mean_view",
                 "var_dims12", "l2_norm_dims12", "l1_norm_flat", "rms_norm_dims23", "frobenius_dims",
                 "instance_norm_module", "batchnorm1d_2d", "groupnorm_literal", "layernorm_affine_module",
                 "var_flat_view", "bn_manual", "gn_manual", "groupnorm4_ncl_affine", "instance_norm_5d_affine"]
# reductions over a trailing run of axes: the row lowering's now (folded into one column axis,
# lower.trailing_fold; tests/test_builtin_trailing.py); the family's own lowering still tested here
FOLDED = {"layernorm_module": 3, "layernorm_last2": 2, "l2_norm_dims12": 2, "rms_norm_dims23": 2,
          "frobenius_dims": 3, "layernorm_affine_module": 2}
SHAPES = {"B": 3, "C": 6, "G": 3, "H": 4, "W": 5, "L": 10, "S": 4, "D": 7, "T": 2}


def _spec(op):
    return load_spec(SPECS[op])


def _dims(spec):
    return {s: SHAPES[s] for s in spec.signature.symbols()}


def _programs(op):
    """The family's programs for `op` (lower_axis directly for the ops the row lowering takes)."""
    return lower_axis(_spec(op)) if op in FOLDED else lower_spec(_spec(op))


def _result(spec, args):
    got = spec.reference_fn()(**args)
    return got if isinstance(got, (tuple, list)) else (got,)


@pytest.mark.parametrize("op", VIEWS)
def test_forward_matches_reference(op):
    spec = _spec(op)
    programs = _programs(op)
    assert family_of(programs) is not None and all(isinstance(p, AxisProgram) for p in programs.values())
    dims = _dims(spec)
    args = make_inputs(spec.signature, dims, "float64", seed=3)
    outs = {o.name: torch.full(o.type.shape(dims), float("nan"), dtype=torch.float64)
            for o in spec.signature.outputs}
    run_axis_program(programs["forward"], dict(args), {}, dims, outs)
    for o, want in zip(spec.signature.outputs, _result(spec, args)):
        torch.testing.assert_close(outs[o.name], want.double().reshape(outs[o.name].shape), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("op", [op for op in VIEWS if load_spec(SPECS[op]).backward == "kernel"])
def test_backward_matches_autograd(op):
    spec = _spec(op)
    sig = spec.signature
    dims = _dims(spec)
    args = make_inputs(sig, dims, "float64", seed=4)
    leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
    result = _result(spec, leaves)
    gen = torch.Generator().manual_seed(5)
    grads = {f"grad_{o.name}": torch.randn(r.shape, generator=gen, dtype=torch.float64)
             for o, r in zip(sig.outputs, result)}
    expected = torch.autograd.grad(list(result), [leaves[p.name] for p in sig.inputs], list(grads.values()))
    tensors = dict(args) | {o.name: r.detach() for o, r in zip(sig.outputs, result)} | grads
    outs = {f"grad_{p.name}": torch.full(args[p.name].shape, float("nan"), dtype=torch.float64) for p in sig.inputs}
    run_axis_program(_programs(op)["backward"], tensors, {}, dims, outs)
    for p, want in zip(sig.inputs, expected):
        torch.testing.assert_close(outs[f"grad_{p.name}"], want, rtol=1e-8, atol=1e-8)


def test_layouts_over_atoms():
    def layout(op):
        return _programs(op)["forward"].layout.describe()

    assert layout("layernorm_module") == "O = B, R = C * H * W, I = 1"
    assert layout("groupnorm_module") == "O = B * 8, R = G * H * W, I = 1"  # 8*G split into 8 and G
    assert layout("instance_norm") == "O = B * C, R = H * W, I = 1"
    assert layout("batchnorm_train_module") == "O = C, R = B x H * W (both ends), I = 1"
    assert layout("group_mean_view") == "O = B * 4, R = G * L, I = 1"
    assert layout("var_dims12") == "O = B, R = C * H, I = W"


@pytest.mark.parametrize("op", sorted(FOLDED))
def test_trailing_runs_lower_to_row_programs(op):
    """Normalizations and norms over a trailing run of axes: a row program over the folded
    axes (rows = the leading dims), matching the reference and its autograd on the interpreter."""
    from builtin_support import check_backward, check_forward

    spec = _spec(op)
    programs = lower_spec(spec)
    assert family_of(programs) is None
    forward = programs["forward"]
    assert forward.fold == FOLDED[op] and len(forward.row_dims) == spec.signature.inputs[0].type.ndim - FOLDED[op]
    check_forward(spec, _dims(spec), tol=1e-8)
    if spec.backward == "kernel":
        check_backward(spec, _dims(spec), tol=1e-8)


def test_refine_and_match():
    B, C, H = Dim("B"), Dim("C"), Dim("H")
    # [B, C, H] viewed as [B, 4, C/4, H]: C splits into the literal 4 and C/4
    atoms, sizes = refine((B, C, H), (5, 28, 11), [((5, False), (4, True), (7, False), (11, False))])
    assert sizes == (5, 4, 7, 11) and atoms[1] == Dim.literal(4) and atoms[2] == Dim("C", 1, 4, 0)
    assert atoms[2].resolve({"C": 40}) == 10
    # a permute's shape ([B, H, C]) cuts no dim of S: left out
    assert refine((B, C, H), (5, 7, 11), [((5, False), (11, False), (7, False))])[1] == (5, 7, 11)
    assert match((5, 7, 11), (35, 11)) == ((0, 1), (2,))
    assert match((5, 7, 11), (1, 7, 1)) == ((), (1,), ())
    assert match((5, 7, 11), (11, 7)) is None  # out of order: a transpose
    assert match((5, 7, 35), (35,)) is None  # two ways to map
    assert match((5, 7, 11), (6,)) is None


def test_views_that_mix_axes_are_refused(tmp_path):
    text = SPECS["layernorm_last2"].read_text().replace("layernorm_last2", "mix_view").replace(
        "return F.layer_norm(x, x.shape[-2:], eps=1e-5)", "return x.transpose(2, 3).sum(dim=(1, 2))").replace(
        "-> Tensor[B, C, H, W]", "-> Tensor[B, W]").replace("backward: kernel", "backward: none")
    path = tmp_path / "mix_view.yaml"
    path.write_text(text)
    with pytest.raises(AgentRefused):
        lower_axis(load_spec(path))


@pytest.mark.nvcc
@pytest.mark.parametrize("op", NORMS + ["groupnorm_3d", "group_mean_view", "var_dims12", "gn_manual",
                                        "groupnorm4_ncl_affine", "instance_norm_5d_affine"])
def test_normalization_sources_compile(op):
    from specgen.agents.builtin.generator import compile_source

    spec = _spec(op)
    compile_source(spec, build_source(spec))


def _c_int(expr: str, env: dict) -> int:
    """A generated C index expression over int64 sizes, evaluated in Python (casts dropped,
    A.<dim> from `env`, / as the non-negative integer division it is there)."""
    import re

    text = expr.replace("(int64_t)", "").replace("(size_t)", "").replace("/", "//")
    text = re.sub(r"A\.(\w+)", lambda m: str(env[m.group(1)]), text)
    return int(eval(text, {}, {}))  # noqa: S307 - our own generated arithmetic


@pytest.mark.parametrize("op,dims", [("groupnorm4_ncl_affine", {"B": 3, "G": 5, "L": 7}),
                                     ("instance_norm_5d_affine", {"B": 3, "C": 4, "T": 2, "H": 3, "W": 5})])
def test_part_totals_visit_each_summed_element_once(op, dims):
    """An affine norm's weight gradient is a part total (a sum over every atom but the channel's):
    the part kernel's index math, read from the emitted C and evaluated here, visits for each
    output element k exactly the elements (or kept elements) whose output coordinate is k."""
    import math

    from specgen.agents.builtin.families.axis_emit import AxisEmitter
    from specgen.agents.builtin.families.axis_parts import PartWriter

    spec = _spec(op)
    program = lower_axis(spec)["backward"]
    em = AxisEmitter(spec, program, "backward")
    assert [(g.atoms, g.over, len(g.totals)) for g in em.part_groups] == \
        [(tuple(em.plan()["part_totals"][0][1]), em.plan()["part_totals"][0][0], 2)]
    assert {s.field for g in em.part_groups for s in g.stores} == {"grad_weight", "grad_bias"}
    parts: PartWriter = em.parts
    g = em.part_groups[0]
    sizes = [d.resolve(dims) for d in parts.atoms]
    space = parts.space(g)
    kp = _c_int(parts.prod(g.atoms), dims)
    m_total = _c_int(parts.prod(parts.summed(g)), dims)
    rin = _c_int(parts.prod(parts.inner_run(g)), dims)
    assert kp == dims["C"] if "C" in dims else kp == 4 * dims["G"]
    assert kp * m_total == math.prod(sizes[a] for a in space)
    strides = {a: math.prod(sizes[b] for b in space[space.index(a) + 1:]) for a in space}
    for k in range(kp):
        base = _c_int(parts.base_expr(g).replace("k", str(k)), dims)
        seen = set()
        for m in range(m_total):
            qo = m // rin
            n0 = base + _c_int(parts.outer_expr(g, str(qo)), dims) + (m - qo * rin)
            seen.add(n0)
        coords = lambda n: [n // strides[a] % sizes[a] for a in g.atoms]  # noqa: E731
        want = {n for n in range(kp * m_total) if coords(n) == [k // math.prod(sizes[b] for b in g.atoms if b > a)
                                                               % sizes[a] for a in g.atoms]}
        assert seen == want, k
