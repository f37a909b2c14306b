"""The value classes a reference accepts, per dtype.

Some references check their inputs' values: `F.binary_cross_entropy` wants probabilities in
[0, 1], and a NaN fails that check. On the CPU the check raises; on the GPU it is a device-side
assert, which ends the CUDA context of the verifier's own process (the truth is computed there),
and every later candidate would meet a dead GPU. So before any case runs, the reference is
called on the CPU for each value class in each dtype, at a few small shapes and seeds: a class
on which it raises while normal values pass is outside the op's domain in that dtype and is not
drawn there; "specials" falls back to "infinities" (no NaN) where the reference takes those.
The verdict names each class left out and why (docs/VERIFIER.md "Inputs"). A case the screen
missed and the reference still refuses on the CPU is skipped (engine.Session.run_case).
"""
from __future__ import annotations

from ..errors import SpecError
from ..inputs import DISTRIBUTIONS, FALLBACKS, make_inputs, upcast
from .strategies import legal_sizes

SCREEN_SIZES = (37, 2, 1)  # every dim near each: a few rows of an odd width, then the smallest rows
SCREEN_SEEDS = (4242, 4243, 4244)  # outliers' signs and places differ from draw to draw


class Domain:
    """Per dtype: the classes to draw (a refused one left out, or its fallback in its place) and
    why each was left out."""

    def __init__(self, classes: dict[str, tuple[str, ...]], rejected: dict[tuple[str, str], str]):
        self.classes = classes  # dtype -> classes drawn
        self.rejected = rejected  # (class, dtype) -> the reference's error

    def of(self, dtype: str) -> tuple[str, ...]:
        return self.classes.get(dtype, DISTRIBUTIONS)

    def describe(self) -> str:
        """One sentence for the verdict: the classes not drawn, in which dtypes, and a reason."""
        if not self.rejected:
            return ""
        by_class: dict[str, list[str]] = {}
        for (cls, dtype) in self.rejected:
            by_class.setdefault(cls, []).append(dtype)
        parts = []
        for cls, dtypes in by_class.items():
            instead = next((f" ({FALLBACKS[cls]} instead)" for d in dtypes if FALLBACKS.get(cls) in self.of(d)), "")
            parts.append(f"{cls} in {'/'.join(dtypes)}{instead}")
        first = next(iter(self.rejected.values()))
        return (f"value class(es) not drawn: {', '.join(parts)} (the reference raises on them on the CPU, e.g. "
                f"{first})")


_DOMAINS: dict = {}  # spec hash -> Domain: the tuner verifies many variants of one spec


def reference_domain(spec) -> Domain:
    """The classes the reference accepts in each dtype: a class is refused in a dtype when the
    reference raises on it at some screened shape and seed while it takes normal values there.
    No class is refused in a dtype where normal values fail too (the verifier's first case then
    reports the reference's error as it always has)."""
    key = spec.hash()
    if key not in _DOMAINS:
        _DOMAINS[key] = _screen(spec)
    return _DOMAINS[key]


def _screen(spec) -> Domain:
    sig = spec.signature
    if not any(p.type.is_floating for p in sig.inputs):
        return Domain({}, {})
    steps = sig.symbol_divisors()
    shapes = []
    for size in SCREEN_SIZES:
        dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [size])[0] for s in sig.symbols()}
        if dims not in shapes:
            shapes.append(dims)
    classes, rejected = {}, {}
    for dtype in spec.dtypes:
        # the (shape, seed) pairs where normal values pass: only there is a refusal about values
        where = [(dims, seed) for dims in shapes for seed in SCREEN_SEEDS
                 if refuses(spec, make_inputs(sig, dims, dtype, seed=seed), dims, dtype) is None]
        drawn = []
        for cls in DISTRIBUTIONS:
            problem = None if cls == "normal" else _refusal(spec, where, dtype, cls)
            if problem is None:
                drawn.append(cls)
                continue
            rejected[(cls, dtype)] = problem
            fallback = FALLBACKS.get(cls)
            if fallback and _refusal(spec, where, dtype, fallback) is None:
                drawn.append(fallback)
        classes[dtype] = tuple(drawn)
    return Domain(classes, rejected)


def refuses(spec, args: dict, dims: dict, dtype: str) -> str | None:
    """The reference's error on these inputs (CPU copies), in the working dtype or in float64."""
    from ..checking import run_reference_checked

    for working, values in ((dtype, args), ("float64", upcast(args))):
        try:
            run_reference_checked(spec, values, dims, working)
        except SpecError as error:
            return str(error).splitlines()[0]
    return None


def _refusal(spec, where: list[tuple[dict, int]], dtype: str, cls: str) -> str | None:
    """The reference's error on class `cls` at some screened (shape, seed) where normal values
    pass, or None."""
    for dims, seed in where:
        problem = refuses(spec, make_inputs(spec.signature, dims, dtype, seed=seed, distribution=cls), dims, dtype)
        if problem is not None:
            return problem
    return None
