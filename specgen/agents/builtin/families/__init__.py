"""Families of ops the row lowering (lower.py) does not take, each in its own module.

Dispatch (generator.lower_spec / build_source): the row lowering first; when it refuses, each
family in FAMILIES in turn (`lower(spec)` returns its programs or raises AgentRefused); when
every family refuses too, the row lowering's refusal stands (op name, YAML line, LLM hint).
A family's programs carry their own emitter: `emit(spec, programs)` -> .cu text.

To add a family: a module with `lower(spec) -> dict[direction, Program subclass]` and
`emit(spec, programs) -> str`, appended to FAMILIES.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...base import AgentRefused


@dataclass(frozen=True)
class Family:
    name: str
    program_type: type
    lower: Callable
    emit: Callable


def _axis_reduce() -> Family:
    from .axis_emit import emit_axis_source
    from .axis_reduce import AxisProgram, lower_axis

    return Family("axis_reduce", AxisProgram, lower_axis, emit_axis_source)


FAMILIES: list[Callable[[], Family]] = [_axis_reduce]


def lower_family(spec, refusal: AgentRefused) -> dict:
    """The first family's programs for `spec`, or `refusal` (the row lowering's) raised."""
    import os

    for make in FAMILIES:
        family = make()
        try:
            return family.lower(spec)
        except AgentRefused:
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
