"""Kernel families beside the row kernel, each in its own module. Two kinds of dispatch:

1. Emitters for programs the row lowering (lower.py) produced: `emitter_for` is the one
   dispatch point emit.emit_source asks; each module says whether a lowered program is its
   kind (`plan_of(program)` -> a plan or None); a program no family claims gets the row emitter.
   In the order they are asked:
    scan        scan.py: cumsum / cumprod / logcumsumexp along one axis, either direction,
                fused with pointwise ops (a program with a scan no kernel takes is refused).
    pointwise   flat.py: no row structure (every value per element or global, every
                input the output's shape or a [W] parameter): one flat vectorized grid.

2. Lowerings of their own, for ops the row lowering refuses (generator.lower_spec /
   build_source): when the row lowering refuses, each family in FAMILIES in turn
   (`lower(spec)` returns its programs or raises AgentRefused); when every family refuses too,
   the row lowering's refusal stands (op name, YAML line, LLM hint). Such programs carry their
   own emitter: `emit(spec, programs)` -> .cu text. To add one: a module with
   `lower(spec) -> dict[direction, Program subclass]` and `emit(spec, programs) -> str`,
   appended to FAMILIES.
    axis_reduce axis_reduce.py / axis_emit.py: reductions over any axes (middle, several, all
                to a scalar), arg-reductions, losses reduced to a scalar; axis_views.py:
                the same through views that merge or split contiguous dims (Layer/Group/
                Instance/BatchNorm over several axes).
    staged      staged.py (+ staged_cut, staged_spec, staged_emit): last of all, a graph cut
                into stages where its reductions change layout, each stage lowered whole by
                the others, one kernel file running them in order.
    specialized specialized.py (+ specialized_emit): int and bool scalars with few values, one
                kernel per combination of values (any family's), chosen at run time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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


@dataclass(frozen=True)
class Family:
    name: str
    program_type: type
    lower: Callable
    emit: Callable
    last: bool = False  # tried only after the row lowering's retries (generator.ROW_RETRIES) refuse too


def _axis_reduce() -> Family:
    from .axis_emit import emit_axis_source
    from .axis_reduce import AxisProgram, lower_axis

    return Family("axis_reduce", AxisProgram, lower_axis, emit_axis_source)


def _staged() -> Family:
    from .staged import StagedProgram, lower_staged
    from .staged_emit import emit_staged_source

    return Family("staged", StagedProgram, lower_staged, emit_staged_source, last=True)


def _specialized() -> Family:
    from .specialized import SpecializedProgram, lower_specialized
    from .specialized_emit import emit_specialized_source

    return Family("specialized", SpecializedProgram, lower_specialized, emit_specialized_source, last=True)


FAMILIES: list[Callable[[], Family]] = [_axis_reduce, _staged, _specialized]


def lower_family(spec, refusal: AgentRefused, last: bool = False) -> dict:
    """The first family's programs for `spec`, or `refusal` (the row lowering's) raised. `last`:
    the families tried after the row lowering's retries (staged, specialized), else the others. A
    family's refusal marked `instead_of_the_first` replaces `refusal` (it says more)."""
    import os

    for make in FAMILIES:
        family = make()
        if family.last != last:
            continue
        try:
            return family.lower(spec)
        except AgentRefused as why:
            if getattr(why, "instead_of_the_first", False):  # it says more than the first refusal
                refusal = why
            continue
        except Exception:  # a graph the family's lowering did not foresee (or a failed IR
            # validation): no kernel, the row lowering's refusal stands; SPECGEN_DEBUG shows it
            if os.environ.get("SPECGEN_DEBUG"):
                raise
            continue
    raise refusal


def family_of(programs: dict) -> Family | None:
    for make in FAMILIES:
        family = make()
        if programs and all(isinstance(p, family.program_type) for p in programs.values()):
            return family
    return None


__all__ = ["FAMILIES", "Family", "emitter_for", "family_of", "flat", "lower_family", "scan"]
