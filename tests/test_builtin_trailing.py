"""Reductions over a contiguous run of trailing axes, lowered by the row lowering as one folded
column axis (lower.Lowering.trailing_fold): LayerNorm / RMSNorm over [H, W] with [H, W]
parameters, sums and means over the last two axes (keepdim or not), forward and backward.
The CPU interpreter matches the reference (float64, and the spec's dtypes at their
tolerances); nvcc compiles the emitted CUDA; reductions the fold cannot express are refused."""
from __future__ import annotations

import pytest
import torch

from builtin_support import check_backward, check_forward, own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import run_program
from specgen.agents.builtin.ir import Program
from specgen.agents.builtin.lower import lower
from specgen.agents.builtin.trace import trace
from specgen.inputs import make_inputs

CASES = {
    "layernorm_hw_affine": [{"B": 3, "H": 5, "W": 7}, {"B": 1, "H": 16, "W": 8}, {"B": 4, "H": 1, "W": 33},
                            {"B": 2, "H": 9, "W": 1}],
    "rmsnorm_hw": [{"B": 2, "T": 3, "H": 5, "W": 7}, {"B": 1, "T": 1, "H": 8, "W": 16}, {"B": 3, "T": 2, "H": 1, "W": 9}],
    "sum_hw_keepdim": [{"B": 3, "H": 5, "W": 7}, {"B": 1, "H": 32, "W": 4}, {"B": 6, "H": 1, "W": 1}],
    "meansq_hw": [{"B": 2, "C": 3, "H": 5, "W": 7}, {"B": 1, "C": 4, "H": 8, "W": 8}],
    "mean_hw_flat": [{"B": 3, "H": 5, "W": 7}, {"B": 2, "H": 1, "W": 12}],
}
TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 2e-2}


@pytest.mark.parametrize("name", list(CASES))
def test_the_row_lowering_folds_the_trailing_axes(name):
    """A row program (not an axis family's), its rows the leading dims and its width the
    product of the trailing ones (in every direction that reduces)."""
    spec = own_spec(name)
    programs = lower_spec(spec)
    assert set(programs) == {"forward", "backward"}
    assert all(type(p) is Program for p in programs.values())
    for program in programs.values():
        if not any(n.op == "rowreduce" for n in program.nodes()):
            continue  # a backward that only broadcasts (a sum's): nothing reduced, nothing to fold
        assert program.fold == 2
        primary = max(spec.signature.inputs, key=lambda p: p.type.ndim)
        assert [str(d) for d in program.row_dims] == [str(d) for d in primary.type.dims[:-2]]
        assert [str(d) for d in program.pitch_dims(primary.type)] == [str(d) for d in primary.type.dims[-2:]]


@pytest.mark.parametrize("name, dims", [(n, d) for n, ds in CASES.items() for d in ds])
def test_forward_and_backward_match_the_reference_in_float64(name, dims):
    spec = own_spec(name)
    check_forward(spec, dims)
    check_backward(spec, dims)


def _run_forward(spec, args, dims):
    program = lower_spec(spec)["forward"]
    tensors = {p.name: args[p.name] for p in spec.signature.inputs}
    scalars = {p.name: args[p.name] for p in spec.signature.scalars}
    outs = {o.name: torch.full(o.type.shape(dims), float("nan"), dtype=torch.float64) for o in spec.signature.outputs}
    run_program(program, tensors, scalars, dims, outs)
    return outs


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_the_reference_in_the_specs_dtypes(name):
    """Inputs in each dtype of the spec; the interpreter (float64 on those values) against the
    reference run in that dtype, at the dtype's tolerance."""
    spec = own_spec(name)
    for dtype in spec.dtypes:
        for dims in CASES[name][:2]:
            args = make_inputs(spec.signature, dims, dtype, seed=11)
            outs = _run_forward(spec, args, dims)
            want = spec.reference_fn()(**args)
            want = want if isinstance(want, tuple) else (want,)
            for o, w in zip(spec.signature.outputs, want):
                assert w.dtype == getattr(torch, dtype)
                torch.testing.assert_close(outs[o.name], w.double(), rtol=TOL[dtype], atol=TOL[dtype])


def test_layernorm_backward_in_float32():
    """The backward against float32 autograd of the reference (weights' grads summed over rows)."""
    spec = own_spec("layernorm_hw_affine")
    dims = {"B": 4, "H": 6, "W": 10}
    sig = spec.signature
    args = make_inputs(sig, dims, "float32", seed=7)
    leaves = {k: v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    out = spec.reference_fn()(**leaves)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    expected = torch.autograd.grad(out, [leaves["x"], leaves["weight"], leaves["bias"]], grad_out)
    tensors = {"x": args["x"], "weight": args["weight"], "bias": args["bias"], "out": out.detach(),
               "grad_out": grad_out}
    outs = {f"grad_{n}": torch.full(args[n].shape, float("nan"), dtype=torch.float64) for n in ("x", "weight", "bias")}
    run_program(lower_spec(spec)["backward"], tensors, {"eps": args["eps"]}, dims, outs)
    for n, want in zip(("x", "weight", "bias"), expected):
        torch.testing.assert_close(outs[f"grad_{n}"], want.double(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_the_source_reads_rows_of_the_folded_pitch(name):
    source = build_source(own_spec(name))
    assert "A.H" in source and "A.W" in source
    assert "((int64_t)(A.H)) * ((int64_t)(A.W))" in source  # the row pitch of the [.., H, W] tensors


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_the_sources_compile(name):
    from specgen.agents.builtin.generator import compile_source

    spec = own_spec(name)
    compile_source(spec, build_source(spec), arch="sm_90")


REFUSAL = ("a reduction over dims", "use an LLM agent")


def _refused_by_the_row_lowering(name: str, *needles: str) -> str:
    spec = own_spec(name)
    with pytest.raises(AgentRefused) as info:
        lower(trace(spec, "forward"))
    message = str(info.value)
    assert f"{name}.yaml:" in message  # the reference line
    for needle in needles:
        assert needle in message
    return message


def test_a_reduction_over_non_trailing_axes_is_refused_by_the_row_lowering():
    """dims (1, 3) of [B, C, H, W]: not a trailing run, nothing is folded (the axis family may
    still take the spec; the row lowering says why it does not)."""
    message = _refused_by_the_row_lowering("sum_mid_last", *REFUSAL)
    assert "[1, 3]" in message


def test_a_parameter_spanning_part_of_the_folded_axes_is_read_per_element_by_the_axis_family():
    """x * w[W] summed over (H, W): w is not a row vector of the folded [H*W] axis, so the row
    lowering refuses; the axis family reads w at each element's W coordinate (a "part" load,
    session 21; refused before)."""
    import torch

    from specgen.agents.builtin.families.axis_reduce import AxisProgram, run_axis_program
    from specgen.agents.builtin.generator import lower_spec

    _refused_by_the_row_lowering("sum_hw_partial_param", *REFUSAL)
    spec = own_spec("sum_hw_partial_param")
    program = lower_spec(spec)["forward"]
    assert isinstance(program, AxisProgram)
    assert [n.attrs["kind"] for n in program.nodes() if n.op == "load" and n.attrs["field"] == "w"] == ["part"]
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64), torch.randn(7, generator=gen, dtype=torch.float64)
    out = {"out": torch.full((3, 1, 1), float("nan"), dtype=torch.float64)}
    run_axis_program(program, {"x": x, "w": w}, {}, {"B": 3, "H": 5, "W": 7}, out)
    torch.testing.assert_close(out["out"], spec.reference_fn()(x, w), rtol=1e-12, atol=1e-12)


def test_reductions_over_two_different_trailing_runs_are_refused(tmp_path):
    """A sum over (H, W) next to a max over W alone: no one folding serves both."""
    from specgen.spec import load_spec

    text = (own_spec("sum_hw_keepdim").path.read_text()
            .replace("name: sum_hw_keepdim", "name: sum_hw_and_w")
            .replace("sum_hw_keepdim(x", "sum_hw_and_w(x")
            .replace("return x.sum(dim=(-2, -1), keepdim=True)",
                     "return x.sum(dim=(-2, -1), keepdim=True) + x.amax(dim=-1, keepdim=True).sum(-2, keepdim=True)"))
    path = tmp_path / "sum_hw_and_w.yaml"
    path.write_text(text)
    with pytest.raises(AgentRefused) as info:
        lower(trace(load_spec(path), "forward"))
    assert "use an LLM agent" in str(info.value) and "sum_hw_and_w.yaml:" in str(info.value)


def test_a_single_trailing_axis_folds_nothing():
    """The committed specs' last-axis reductions keep fold 1 (their kernels do not change)."""
    from pathlib import Path

    from specgen.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parent.parent / "specs" / "layernorm_gelu.yaml")
    assert all(p.fold == 1 for p in lower_spec(spec).values())


@pytest.mark.nvcc
@pytest.mark.slow
def test_every_variant_of_the_folded_layernorm_compiles():
    """The tuner's variants (row schedules, splits, cluster, two-pass, moments) all build on the
    folded program."""
    from specgen.agents.builtin.generator import compile_many
    from specgen.agents.builtin.schedule import VARIANTS

    spec = own_spec("layernorm_hw_affine")
    results = compile_many([(spec, build_source(spec, v), "sm_90") for v in VARIANTS])
    failed = [(v.name, r) for v, r in zip(VARIANTS, results) if isinstance(r, Exception)]
    assert not failed, failed
