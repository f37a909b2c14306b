"""The value classes a reference accepts.

Some references check their inputs' values: `F.binary_cross_entropy` wants probabilities in
[0, 1], and a NaN fails that check. On the CPU the check raises; on the GPU it is a device-side
assert, which ends the CUDA context of the verifier's own process (the truth is computed there),
and every later candidate would meet a dead GPU. So before any case runs, the reference is
called on the CPU once per value class, at a small shape: a class on which it raises while
normal values pass is outside the op's domain and is not drawn. The verdict names each class
left out and why (docs/VERIFIER.md "Inputs").
"""
from __future__ import annotations

from ..errors import SpecError
from ..inputs import DISTRIBUTIONS, make_inputs, upcast
from .strategies import legal_sizes

SCREEN_SIZE = 37  # every dim near this size: a few rows of an odd width, as the smoke case
SCREEN_SEED = 4242


def rejected_value_classes(spec) -> dict[str, str]:
    """{value class: the reference's error} for each class the reference refuses on the CPU while
    it accepts normal values at the same shape and dtype. {} when normal values fail too (the
    verifier's first case then reports the reference's error as it always has)."""
    sig = spec.signature
    if not any(p.type.is_floating for p in sig.inputs):
        return {}
    steps = sig.symbol_divisors()
    dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [SCREEN_SIZE])[0] for s in sig.symbols()}
    rejected: dict[str, str] = {}
    for dtype in spec.dtypes:
        if _refusal(spec, dims, dtype, "normal") is not None:
            continue  # the reference does not run here at all: not a question of values
        for distribution in DISTRIBUTIONS:
            if distribution == "normal" or distribution in rejected:
                continue
            problem = _refusal(spec, dims, dtype, distribution)
            if problem is not None:
                rejected[distribution] = problem
    return rejected


def _refusal(spec, dims: dict[str, int], dtype: str, distribution: str) -> str | None:
    """The reference's error on this class in the working dtype or in float64 (the truth), or None."""
    from ..checking import run_reference_checked

    args = make_inputs(spec.signature, dims, dtype, seed=SCREEN_SEED, distribution=distribution)
    for working, values in ((dtype, args), ("float64", upcast(args))):
        try:
            run_reference_checked(spec, values, dims, working)
        except SpecError as error:
            return str(error).splitlines()[0]
    return None


def describe(rejected: dict[str, str]) -> str:
    """One sentence for the verdict: the classes not drawn and the first reason."""
    if not rejected:
        return ""
    first = next(iter(rejected.values()))
    return (f"value class(es) not drawn: {', '.join(rejected)} (the reference raises on them on the CPU, e.g. "
            f"{first})")
