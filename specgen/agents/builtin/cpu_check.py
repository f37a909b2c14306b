"""A lowered spec run by the CPU interpreter (float64) against its reference and the reference's
autograd: a lowering bug shows here, before any kernel is compiled or a GPU is reached.

The interpreter gives each IR node the emitter's meaning (interp.py; the axis family's own ops
through run_axis_program), so a mismatch is the lowering's, not the schedule's: the verifier on a
GPU is still what checks a kernel.
"""
from __future__ import annotations

import torch

from ...inputs import make_inputs
from .families.axis_reduce import AxisProgram, run_axis_program
from .generator import lower_spec
from .interp import run_program


def run_lowered(program, tensors: dict, scalars: dict, dims: dict, outputs: dict) -> None:
    """Any family's program on the CPU: the interpreter (a staged one stage by stage)."""
    from .families.specialized import SpecializedProgram
    from .families.staged import StagedProgram

    if isinstance(program, (StagedProgram, SpecializedProgram)):
        program.run(tensors, scalars, dims, outputs)
        return
    (run_axis_program if isinstance(program, AxisProgram) else run_program)(program, tensors, scalars, dims, outputs)


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _inputs(spec, dims: dict, seed: int, scalar_point: float | None, scalars: dict | None = None) -> dict:
    """make_inputs' float64 inputs; with `scalar_point` (a fraction), each float scalar with a
    range at that point of it instead of its default (a number baked in from the traced value
    can match at the default by chance: a red team's 2 sin(a / 2) taken as a, session 40);
    `scalars`: values given outright (an int or bool scalar's, for specialized kernels)."""
    args = make_inputs(spec.signature, dims, "float64", seed=seed) | dict(scalars or {})
    if scalar_point is not None:
        for p in spec.signature.scalars:
            if p.type.kind == "float" and p.value_range is not None:
                lo, hi = p.value_range
                args[p.name] = lo + (hi - lo) * scalar_point
    return args


def check_forward(spec, dims: dict, seed: int = 3, tol: float = 1e-9, programs: dict | None = None,
                  scalar_point: float | None = None, scalars: dict | None = None) -> None:
    """The forward program's outputs equal the reference's at `dims` (AssertionError otherwise)."""
    args = _inputs(spec, dims, seed, scalar_point, scalars)
    program = (programs or lower_spec(spec))["forward"]
    tensors = {p.name: args[p.name] for p in spec.signature.inputs}
    scalars = {p.name: args[p.name] for p in spec.signature.scalars}
    outs = {o.name: torch.full(o.type.shape(dims), float("nan"), dtype=torch.float64)
            for o in spec.signature.outputs}
    run_lowered(program, tensors, scalars, dims, outs)
    for o, want in zip(spec.signature.outputs, _as_tuple(spec.reference_fn()(**args))):
        torch.testing.assert_close(outs[o.name], want.double(), rtol=tol, atol=tol, equal_nan=True)


def check_backward(spec, dims: dict, seed: int = 4, tol: float = 1e-9, programs: dict | None = None,
                   scalar_point: float | None = None, scalars: dict | None = None) -> None:
    """The backward program's input gradients equal autograd's through the reference at `dims`."""
    sig = spec.signature
    args = _inputs(spec, dims, seed, scalar_point, scalars)
    differentiable = {p.name for p in sig.inputs if p.type.differentiable}  # no_grad inputs take no grad
    leaves = {k: (v.clone().requires_grad_() if k in differentiable and v.is_floating_point() else v)
              for k, v in args.items()}
    result = _as_tuple(spec.reference_fn()(**leaves))
    gen = torch.Generator().manual_seed(5)
    grads = {f"grad_{o.name}": torch.randn(r.shape, generator=gen, dtype=torch.float64)
             for o, r in zip(sig.outputs, result) if o.type.is_floating}
    floating = [p.name for p in sig.inputs if p.type.differentiable]  # no_grad inputs: no gradient written
    # outputs computed without autograd (a module's running statistics) take no gradient, as in trace.py
    graded = [(r, grads[f"grad_{o.name}"]) for o, r in zip(sig.outputs, result) if o.type.is_floating
              and r.requires_grad]
    expected = torch.autograd.grad([r for r, _ in graded], [leaves[n] for n in floating], [g for _, g in graded],
                                   allow_unused=True)
    program = (programs or lower_spec(spec))["backward"]
    forward_outputs = {o.name: r.detach() for o, r in zip(sig.outputs, result)}
    tensors = {p.name: args[p.name] for p in sig.inputs} | forward_outputs | grads
    outs = {f"grad_{n}": torch.full(args[n].shape, float("nan"), dtype=torch.float64) for n in floating}
    run_lowered(program, tensors, {p.name: args[p.name] for p in sig.scalars}, dims, outs)
    for n, want in zip(floating, expected):
        want = torch.zeros_like(args[n]) if want is None else want
        torch.testing.assert_close(outs[f"grad_{n}"], want, rtol=tol, atol=tol, equal_nan=True)
