"""Family: int and bool scalars, one kernel per value, chosen at run time.

The trace runs float scalars as sentinels (trace.py) and refuses int and bool ones: they may
steer the reference's Python (a flag that skips a term, a bit width in a loop bound), so one
traced graph holds for one value only. Where each such scalar has few values - a bool, an int
whose range `in [lo, hi]` has at most MAX_INT_VALUES values, or an int without a range (the
verifier only ever draws its default) at its default - the spec is lowered once per combination
of values (at most MAX_COMBINATIONS): each a spec of its own without those scalars, whose
reference calls the user's with the values fixed, lowered by any family (staged included). One
kernel file holds them all (specialized_emit.py); the entry point picks the one the call's values
name, and returns cudaErrorInvalidValue for a value outside them (never a kernel traced at
another value).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ....reference_import import reference_code
from ....signature import format_scalar
from ....spec import KernelSpec
from ...base import AgentRefused

MAX_INT_VALUES = 8
MAX_COMBINATIONS = 16
LLM = "use an LLM agent (--agent openai|anthropic|openai-compatible)"


@dataclass
class Choice:
    values: dict  # scalar name -> its value in this kernel
    spec: KernelSpec  # the spec with those scalars fixed


@dataclass
class SpecializedProgram:
    op: str
    direction: str
    choices: list[Choice]

    def programs(self) -> list:
        from ..generator import lower_spec

        return [lower_spec(c.spec)[self.direction] for c in self.choices]

    def describe(self) -> str:
        lines = [f"specialized program {self.op} {self.direction}: {len(self.choices)} kernels"]
        for choice, program in zip(self.choices, self.programs()):
            lines.append(f"  {choice.values}: {choice.spec.name}")
            lines += ["    " + line for line in program.describe().splitlines()]
        return "\n".join(lines)

    def run(self, tensors: dict, scalars: dict, dims: dict, outputs: dict) -> None:
        """The CPU interpreter: the kernel of the call's values (ValueError outside them)."""
        from ..cpu_check import run_lowered
        from ..generator import lower_spec

        for choice in self.choices:
            if all(scalars[k] == v for k, v in choice.values.items()):
                kept = {p.name: scalars[p.name] for p in choice.spec.signature.scalars}
                run_lowered(lower_spec(choice.spec)[self.direction], tensors, kept, dims, outputs)
                return
        raise ValueError(f"{self.op}: no kernel for {scalars}")


def _refusal(message: str) -> AgentRefused:
    """A refusal that replaces the trace's "float scalars only": it says which value, or what to
    narrow, where that one would only say that the scalar is an int."""
    refusal = AgentRefused(message)
    refusal.instead_of_the_first = True
    return refusal


def scalar_values(spec) -> dict[str, list]:
    """The values each int and bool scalar takes in a kernel (AgentRefused when too many)."""
    found = {}
    for p in spec.signature.scalars:
        if p.type.kind == "bool":
            found[p.name] = [False, True]
        elif p.type.kind == "int":
            if p.value_range is not None:
                lo, hi = int(p.value_range[0]), int(p.value_range[1])
                if hi - lo + 1 > MAX_INT_VALUES:
                    raise _refusal(f"{spec.path}: the int scalar {p.name} takes {hi - lo + 1} values "
                                       f"(in [{lo}, {hi}]); the builtin generator makes one kernel per value, at "
                                       f"most {MAX_INT_VALUES}: narrow its range, or {LLM}")
                found[p.name] = list(range(lo, hi + 1))
            elif p.has_default:
                found[p.name] = [int(p.default)]  # the verifier draws no other value
            else:
                raise _refusal(f"{spec.path}: the int scalar {p.name} has neither a range nor a default; "
                                   f"give it `in [lo, hi]` (at most {MAX_INT_VALUES} values), or {LLM}")
    return found


def fixed_spec(spec, values: dict, index: int) -> KernelSpec:
    """`spec` without the scalars in `values`, its reference the user's with them fixed."""
    sig = spec.signature.rows()
    params = [str(p) for p in sig.params if p.name not in values]
    outputs = ", ".join(f"{o.name}: {o.type}" for o in sig.outputs)
    name = f"{spec.name}_v{index}"
    fixed = ", ".join(f"{k}={v!r}" for k, v in values.items())
    kept = [p for p in sig.params if p.name not in values]
    wrapper = (f"\n\n_specgen_user_reference = reference\n\n\n"
               f"def reference({', '.join(_param_text(p) for p in kept)}):\n"
               f"    return _specgen_user_reference({', '.join(f'{p.name}={p.name}' for p in kept)}, {fixed})\n")
    data = spec.model_dump(by_alias=True)
    data.update(name=name, signature=f"{name}({', '.join(params)}) -> ({outputs})",
                reference=reference_code(spec) + wrapper, path=spec.path, reference_line=spec.reference_line,
                description=f"{spec.name} at {fixed} (the builtin generator's specialized kernels)")
    data.pop("replaces", None)
    return KernelSpec.model_validate(data)


def _param_text(p) -> str:
    return f"{p.name}={format_scalar(p.default)}" if not p.is_tensor and p.has_default else p.name


def lower_specialized(spec) -> dict:
    """{direction: SpecializedProgram}, or AgentRefused."""
    from ..generator import lower_spec

    values = scalar_values(spec)
    if not values:
        raise AgentRefused(f"{spec.path}: no int or bool scalar to make kernels for")
    if spec.saved_values:
        raise _refusal(f"{spec.path}: kernels for int or bool scalars do not take saved intermediates; {LLM}")
    combos = [dict(zip(values, vs)) for vs in itertools.product(*values.values())]
    if len(combos) > MAX_COMBINATIONS:
        raise _refusal(f"{spec.path}: the int and bool scalars take {len(combos)} combinations of values; the "
                           f"builtin generator makes one kernel per combination, at most {MAX_COMBINATIONS}; {LLM}")
    choices = []
    for index, combo in enumerate(combos):
        fixed = fixed_spec(spec, combo, index)
        try:
            lower_spec(fixed)
        except AgentRefused as why:  # the kernel at these values is refused: say so, and why
            where, _, what = str(why).removeprefix(f"{spec.path}").partition(": ")
            at = ", ".join(f"{k}={v!r}" for k, v in combo.items())
            raise _refusal(f"{spec.path}{where}: at {at}, {what}") from None
        choices.append(Choice(combo, fixed))
    directions = ["forward"] + (["backward"] if spec.backward == "kernel" else [])
    return {d: SpecializedProgram(spec.op, d, choices) for d in directions}
