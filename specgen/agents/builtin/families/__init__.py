"""Kernel families beside the row kernel: each module says whether a lowered program is
its kind (`plan_of(program)` -> a plan or None) and emits it. `emitter_for` is the one
dispatch point emit.emit_source asks; a program no family claims gets the row emitter.

Families, in the order they are asked:
    pointwise   flat.py: no row structure (every value per element or global, every
                input the output's shape or a [W] parameter): one flat vectorized grid.
"""
from __future__ import annotations

from . import flat


def emitter_for(spec, program, direction: str, variant):
    """The emitter of one direction: a family's when one claims the program, else the row
    kernel's (emit.DirectionEmitter)."""
    from ..emit import DirectionEmitter

    plan = flat.plan_of(program)
    if plan is not None:
        return flat.FlatEmitter(spec, program, direction, variant, plan)
    return DirectionEmitter(spec, program, direction, variant)


__all__ = ["emitter_for", "flat"]
