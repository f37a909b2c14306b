"""Helpers for the builtin generator's family tests: a spec's lowered programs run by the
CPU interpreter (float64) against its reference and the reference's autograd."""
from __future__ import annotations

from pathlib import Path

import torch

from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import run_program
from specgen.inputs import make_inputs
from specgen.spec import load_spec

OWN = Path(__file__).resolve().parent / "builtin_specs"


def own_spec(name: str):
    return load_spec(OWN / f"{name}.yaml")


def compiles_for_hopper(spec) -> None:
    """The generated source compiles with nvcc for sm_90 (raises with nvcc's message otherwise)."""
    from specgen.agents.builtin import build_source
    from specgen.agents.builtin.generator import compile_source

    compile_source(spec, build_source(spec), arch="sm_90")


def verifies_on_the_gpu(spec) -> None:
    """The generated kernel passes the verifier (a GPU test)."""
    from specgen.agents.builtin import build_source
    from specgen.verify import verify_kernel

    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()


def check_forward(spec, dims: dict, seed: int = 3, tol: float = 1e-9):
    args = make_inputs(spec.signature, dims, "float64", seed=seed)
    program = lower_spec(spec)["forward"]
    tensors = {p.name: args[p.name] for p in spec.signature.inputs}
    scalars = {p.name: args[p.name] for p in spec.signature.scalars}
    outs = {o.name: torch.full(o.type.shape(dims), float("nan"), dtype=torch.float64)
            for o in spec.signature.outputs}
    from specgen.agents.builtin.families.axis_reduce import AxisProgram, run_axis_program

    (run_axis_program if isinstance(program, AxisProgram) else run_program)(program, tensors, scalars, dims, outs)
    expected = spec.reference_fn()(**args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for o, want in zip(spec.signature.outputs, expected):
        torch.testing.assert_close(outs[o.name], want.double(), rtol=tol, atol=tol, equal_nan=True)


def check_backward(spec, dims: dict, seed: int = 4, tol: float = 1e-9):
    sig = spec.signature
    args = make_inputs(sig, dims, "float64", seed=seed)
    differentiable = {p.name for p in sig.inputs if p.type.differentiable}  # no_grad inputs take no grad
    leaves = {k: (v.clone().requires_grad_() if k in differentiable and v.is_floating_point() else v)
              for k, v in args.items()}
    result = spec.reference_fn()(**leaves)
    result = result if isinstance(result, tuple) else (result,)
    gen = torch.Generator().manual_seed(5)
    grads = {f"grad_{o.name}": torch.randn(r.shape, generator=gen, dtype=torch.float64)
             for o, r in zip(sig.outputs, result) if o.type.is_floating}
    floating = [p.name for p in sig.inputs if p.type.differentiable]  # no_grad inputs: no gradient written
    expected = torch.autograd.grad([r for o, r in zip(sig.outputs, result) if o.type.is_floating],
                                   [leaves[n] for n in floating], list(grads.values()), allow_unused=True)
    program = lower_spec(spec)["backward"]
    forward_outputs = {o.name: r.detach() for o, r in zip(sig.outputs, result)}
    tensors = {p.name: args[p.name] for p in sig.inputs} | forward_outputs | grads
    outs = {f"grad_{n}": torch.full(args[n].shape, float("nan"), dtype=torch.float64) for n in floating}
    from specgen.agents.builtin.families.axis_reduce import AxisProgram, run_axis_program

    run = run_axis_program if isinstance(program, AxisProgram) else run_program
    run(program, tensors, {p.name: args[p.name] for p in sig.scalars}, dims, outs)
    for n, want in zip(floating, expected):
        want = torch.zeros_like(args[n]) if want is None else want
        torch.testing.assert_close(outs[f"grad_{n}"], want, rtol=tol, atol=tol, equal_nan=True)


def without_saved(path: Path, tmp_path: Path):
    """The spec at `path` with its `saved:` block dropped: the example specs declare saved values
    since session 12, and the tests compare against the same op recomputing its statistics."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    data.pop("saved", None)
    plain = Path(tmp_path) / Path(path).name
    plain.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(plain)


def logcumsumexp_backward_as_the_kernel(x, g, out, round_value: bool = True):
    """logcumsumexp's backward as the emitted kernel computes it: log|g| - out in float32, the
    reversed log-sum-exp carried in float64, then (round_value) rounded to float32 before + x, or
    kept in float64 for the sum (session 24's form, which failed the H200's huge values)."""
    lowest = torch.tensor(torch.finfo(torch.float32).min)
    grad = torch.zeros_like(x)
    for sign in (1, -1):
        shifted = torch.where(g * sign > 0, g.abs().log(), lowest) - out
        carried = shifted.double().flip(-1).logcumsumexp(-1).flip(-1)
        total = carried.float() + x if round_value else (carried + x.double()).float()
        grad = grad + sign * total.exp()
    return grad
