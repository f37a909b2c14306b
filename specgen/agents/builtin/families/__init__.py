"""Kernel families beside the row kernel: each module says whether a lowered program is
its kind (`plan_of(program)` -> a plan or None) and emits it. `emitter_for` is the one
dispatch point emit.emit_source asks; a program no family claims gets the row emitter.

Families, in the order they are asked:
    scan        scan.py: cumsum / cumprod / logcumsumexp along one axis, either direction,
                fused with pointwise ops (a program with a scan no kernel takes is refused).
    pointwise   flat.py: no row structure (every value per element or global, every
                input the output's shape or a [W] parameter): one flat vectorized grid.
"""
from __future__ import annotations

from ...base import AgentRefused
from . import flat, scan


def emitter_for(spec, program, direction: str, variant):
    """The emitter of one direction: a family's when one claims the program, else the row
    kernel's (emit.DirectionEmitter)."""
    from ..emit import DirectionEmitter

    plan = scan.plan_of(program)  # raises AgentRefused for a scan outside the family
    if plan is not None:
        return scan.ScanEmitter(spec, program, direction, variant, plan)
    plan = flat.plan_of(program, variant)
    if plan is not None:
        return flat.FlatEmitter(spec, program, direction, variant, plan)
    if any(n.op == "load" and n.attrs.get("kind") == "bcast" for n in program.nodes()):
        raise AgentRefused(f"{spec.path}: the {direction} reads a tensor broadcast over inner dims (a per-channel "
                           f"parameter of [N, C, H, W]) in a kernel with row reductions: outside the builtin "
                           f"generator's families; use an LLM agent (--agent openai|anthropic|openai-compatible)")
    return DirectionEmitter(spec, program, direction, variant)


__all__ = ["emitter_for", "flat", "scan"]
