"""The value classes a reference accepts, per dtype.

Some references check their inputs' values: `F.binary_cross_entropy` wants probabilities in
[0, 1], and a NaN fails that check. On the CPU the check raises; on the GPU it is a device-side
assert, which ends the CUDA context of the verifier's own process (the truth is computed there),
and every later candidate would meet a dead GPU. So before any case runs, the reference is
called on the CPU for each value class in each dtype, at a few small shapes and seeds: a class
on which it raises while normal values pass is screened input by input, and drawn only on the
inputs that take it; an input that refuses it gets the class's fallback ("infinities", no NaN,
for "specials": sigmoid(+-inf) is a probability) or normal values.
The verdict names each class left out and why (docs/VERIFIER.md "Inputs"). A case the screen
missed and the reference still refuses on the CPU is skipped (engine.Session.run_case).
"""
from __future__ import annotations

import torch

from ..errors import SpecError
from ..inputs import DISTRIBUTIONS, FALLBACKS, as_tuple, identity_inputs, make_inputs, upcast

SCREEN_SIZES = (37, 2, 1)  # every dim near each: a few rows of an odd width, then the smallest rows
SCREEN_SEEDS = (4242, 4243, 4244)  # outliers' signs and places differ from draw to draw


class Domain:
    """Per dtype: the classes to draw and, for a class some input refuses, what that input gets
    instead (its fallback, or normal values); why each class was refused as a whole. Empty
    (`Domain()`): every class in every dtype on every input, as for a reference not screened."""

    def __init__(self, classes: dict[str, tuple[str, ...]] | None = None,
                 rejected: dict[tuple[str, str], str] | None = None,
                 instead: dict[tuple[str, str], tuple[tuple[str, str], ...]] | None = None,
                 overflows: dict[tuple[str, str], str] | None = None):
        self.classes = classes or {}  # dtype -> classes drawn
        self.rejected = rejected or {}  # (class, dtype) -> the reference's error with the class on every input
        self.instead = instead or {}  # (class, dtype) -> ((input, class drawn there instead), ...)
        # (class, dtype) -> how the reference overflows there (OVERFLOW_SCREENED classes): not drawn,
        # named in no verdict (an honest reference's limit, not a refusal)
        self.overflows = overflows or {}

    def of(self, dtype: str) -> tuple[str, ...]:
        return self.classes.get(dtype, DISTRIBUTIONS)

    def overrides(self, cls: str, dtype: str) -> tuple[tuple[str, str], ...]:
        return self.instead.get((cls, dtype), ())

    def describe(self) -> str:
        """One sentence for the verdict: the classes the reference refused, where, and what was
        drawn instead."""
        if not self.rejected:
            return ""
        parts = []
        for (cls, dtype) in self.rejected:
            instead = self.overrides(cls, dtype)
            where = (f" (drawn with {', '.join(f'{k}: {v}' for k, v in instead)})" if cls in self.of(dtype)
                     else " (not drawn)")
            parts.append(f"{cls} in {dtype}{where}")
        first = next(iter(self.rejected.values()))
        return (f"value class(es) the reference refuses: {'; '.join(parts)} (it raises on them on the CPU, e.g. "
                f"{first})")


_DOMAINS: dict = {}  # spec hash -> Domain: the tuner verifies many variants of one spec


def reference_domain(spec, progress=lambda text: None) -> Domain:
    """The classes the reference accepts in each dtype: a class is refused in a dtype when the
    reference raises on it at some screened shape and seed while it takes normal values there.
    No class is refused in a dtype where normal values fail too (the verifier's first case then
    reports the reference's error as it always has). `progress` hears each (dtype, class) screened:
    the screen runs the reference on the CPU, forward and backward, before the kernel's first case,
    and on a busy machine it took over a minute (the worker's watch for progress must not call
    that a hung kernel)."""
    key = spec.hash()
    if key not in _DOMAINS:
        _DOMAINS[key] = _screen(spec, progress)
    return _DOMAINS[key]


def _screen(spec, progress=lambda text: None) -> Domain:
    from .strategies import legal_sizes  # strategies takes a Domain: imported here, not at the top

    sig = spec.signature
    if not any(p.type.is_floating for p in sig.inputs):
        return Domain()
    steps = sig.symbol_divisors()
    shapes = []
    for size in SCREEN_SIZES:
        dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [size])[0] for s in sig.symbols()}
        if dims not in shapes:
            shapes.append(dims)
    classes, rejected, instead, overflows = {}, {}, {}, {}
    for dtype in spec.dtypes:
        # the (shape, seed) pairs where normal values pass: only there is a refusal about values
        where = [(dims, seed) for dims in shapes for seed in SCREEN_SEEDS
                 if refuses(spec, make_inputs(sig, dims, dtype, seed=seed), dims, dtype) is None]
        drawn = []
        for cls in DISTRIBUTIONS:
            if cls == "identity" and not identity_inputs(sig):
                continue  # no weight or table to hold a constant: the class would be normal values
            progress(f"screening the reference on {cls} values in {dtype} (on the CPU, before any kernel call)")
            problem = None if cls == "normal" else _refusal(spec, where, dtype, cls)
            if problem is None and cls in OVERFLOW_SCREENED:
                problem = _overflow(spec, where, dtype, cls)
                if problem is not None:  # not drawn at all: a reference that overflows is no truth
                    overflows[(cls, dtype)] = problem
                    continue
            if problem is None:
                drawn.append(cls)
                continue
            rejected[(cls, dtype)] = problem
            swaps = _per_input(spec, where, dtype, cls)
            if swaps is not None:
                drawn.append(cls)
                instead[(cls, dtype)] = swaps
        classes[dtype] = tuple(drawn)
    return Domain(classes, rejected, instead, overflows)


def _per_input(spec, where: list[tuple[dict, int]], dtype: str, cls: str) -> tuple[tuple[str, str], ...] | None:
    """The class on the inputs that take it alone, each other input drawn from its fallback
    (inputs.FALLBACKS) or from normal values; None when no input keeps the class or a fallback,
    or when the inputs refuse it together."""
    names = [p.name for p in spec.signature.inputs if p.type.is_floating]
    swaps = []
    for name in names:
        alone = {other: "normal" for other in names if other != name}
        if _refusal(spec, where, dtype, cls, alone) is None:
            continue
        fallback = FALLBACKS.get(cls)
        ok = fallback and _refusal(spec, where, dtype, fallback, alone) is None
        swaps.append((name, fallback if ok else "normal"))
    if len(swaps) == len(names) and all(v == "normal" for _, v in swaps):
        return None  # nothing of the class is left
    swaps = tuple(swaps)
    return swaps if _refusal(spec, where, dtype, cls, dict(swaps)) is None else None


# Classes drawn only where the reference computes them in the working dtype without overflowing:
# "mask-min" puts the dtype's most negative finite value in rows, which a softmax takes in its stride
# but whose square or sum overflows in a norm's or a mean's float32 (the truth, in float64, does not)
OVERFLOW_SCREENED = ("mask-min",)


def _overflow(spec, where: list[tuple[dict, int]], dtype: str, cls: str) -> str | None:
    """How the reference overflows on `cls` in the working dtype (an output NaN or infinite where its
    float64 result is finite) at some screened (shape, seed), or None."""
    from ..checking import run_reference_checked

    for dims, seed in where:
        args = make_inputs(spec.signature, dims, dtype, seed=seed, distribution=cls)
        try:
            low = run_reference_checked(spec, args, dims, dtype)
            wide = run_reference_checked(spec, upcast(args), dims, "float64")
        except SpecError as error:
            return str(error).splitlines()[0]
        pairs = list(zip(as_tuple(low), as_tuple(wide)))
        if spec.backward == "kernel":
            pairs += zip(_gradients(spec, args), _gradients(spec, upcast(args)))
        for got, truth in pairs:
            if isinstance(got, torch.Tensor) and got.is_floating_point():
                bad = ~torch.isfinite(got.double()) & torch.isfinite(truth.double())
                if bool(bad.any()):
                    return f"the reference overflows in {dtype} on {cls} values (non-finite where float64 is finite)"
    return None


def _gradients(spec, args: dict) -> list:
    """The reference's input gradients under output gradients of ones (None where unused)."""
    from .data import reference_gradients

    wrt = [p.name for p in spec.signature.inputs if p.type.differentiable and isinstance(args.get(p.name), torch.Tensor)]
    return reference_gradients(spec, args, wrt, lambda o, out: torch.ones_like(out))


def refuses(spec, args: dict, dims: dict, dtype: str) -> str | None:
    """The reference's error on these inputs (CPU copies), in the working dtype or in float64."""
    from ..checking import run_reference_checked

    for working, values in ((dtype, args), ("float64", upcast(args))):
        try:
            run_reference_checked(spec, values, dims, working)
        except SpecError as error:
            return str(error).splitlines()[0]
    return None


def _refusal(spec, where: list[tuple[dict, int]], dtype: str, cls: str, overrides: dict | None = None) -> str | None:
    """The reference's error on class `cls` (inputs in `overrides` drawn as it says) at some
    screened (shape, seed) where normal values pass, or None."""
    for dims, seed in where:
        args = make_inputs(spec.signature, dims, dtype, seed=seed, distribution=cls, overrides=overrides)
        problem = refuses(spec, args, dims, dtype)
        if problem is not None:
            return problem
    return None
