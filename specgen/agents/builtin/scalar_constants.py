"""Numbers the reference computes from a float scalar while it is traced.

Float scalars trace as sentinel values (trace.sentinel) and the lowering
maps a sentinel back to its ABI field. A decomposition may also compute a number from the
scalar in Python (CELU's backward multiplies by 1 / alpha): such a number must become an
expression of the scalar, never a constant baked into the kernel (a held-out CELU's backward
was exp(x * 8100) for every alpha). FORMS lists the numbers recognised, each also times one of
SCALES (Huber's decomposition takes 0.5 * delta); `differing_constants`
compares two traces made with different sentinels, so that a number computed from a scalar in
any other way is refused instead of baked in.
"""
from __future__ import annotations

import math

import torch

# form -> (its value from the scalar's value, the IR ops applied to the scalar in order;
# "square" is mul(x, x))
FORMS: dict[str, tuple] = {
    "identity": (lambda s: s, ()),
    "neg": (lambda s: -s, ("neg",)),
    "reciprocal": (lambda s: 1.0 / s, ("reciprocal",)),
    "neg_reciprocal": (lambda s: -1.0 / s, ("reciprocal", "neg")),
    "square": (lambda s: s * s, ("square",)),
    "sqrt": (math.sqrt, ("sqrt",)),
    "rsqrt": (lambda s: 1.0 / math.sqrt(s), ("rsqrt",)),
    "log": (math.log, ("log",)),
    "log1p": (math.log1p, ("log1p",)),  # mu-law companding's log1p(mu) normalizer
    "one_minus": (lambda s: 1.0 - s, ("one_minus",)),  # a focal loss's 1 - alpha
    "one_plus": (lambda s: 1.0 + s, ("one_plus",)),
    "minus_one": (lambda s: s - 1.0, ("minus_one",)),  # pow's backward: x ** (gamma - 1)
    # the backward of a power at the reciprocal exponent (GeM's mean ** (1 / p)): x ** (1 / p - 1)
    "reciprocal_minus_one": (lambda s: 1.0 / s - 1.0, ("reciprocal", "minus_one")),
}
# an affine step first, then a unary one: a diffusion step's sqrt(1 - alpha_bar) and
# 1 / sqrt(alpha_bar)'s kin, log(1 - p), 1 / (1 + beta) (held-out problems-v11's DDIM step)
_INNER = ("one_minus", "one_plus", "minus_one")
_OUTER = ("neg", "reciprocal", "neg_reciprocal", "square", "sqrt", "rsqrt", "log")


def _same_function(f, g) -> bool:
    """f and g agree wherever both are defined at a few points (-(1 - s) is s - 1)."""
    agree = 0
    for s in (0.3, 0.7, 2.5, 7.0):
        try:
            a, b = f(s), g(s)
        except (ValueError, ZeroDivisionError):
            continue
        if abs(a - b) > 1e-12 * max(1.0, abs(a)):
            return False
        agree += 1
    return agree > 0


def _composed_forms() -> dict[str, tuple]:
    """outer(inner(s)) for each pair that is defined at the tracer's small sentinels (sqrt(s - 1)
    never is: the trace itself would raise) and is no form already listed."""
    found: dict[str, tuple] = {}
    for inner in _INNER:
        for outer in _OUTER:
            fn = (lambda s, fi=FORMS[inner][0], fo=FORMS[outer][0]: fo(fi(s)))
            try:
                fn(1e-4)
            except (ValueError, ZeroDivisionError):
                continue
            if not any(_same_function(fn, known) for known, _ in [*FORMS.values(), *found.values()]):
                found[f"{outer}_of_{inner}"] = (fn, FORMS[inner][1] + FORMS[outer][1])
    return found


FORMS.update(_composed_forms())
# The sentinels are small (trace.SENTINEL_BASE), so 1 / (1 - s) and 1 + s differ by s^2, 3e-8 relative:
# below float32's rounding. Python's math computes a composed form in double, exactly: composed forms
# match only to double rounding (COMPOSED_REL), and `match` takes the closest form within reach.
COMPOSED = frozenset(name for name in FORMS if "_of_" in name)
COMPOSED_REL = 1e-12
# small constant factors a decomposition puts on such a number (Huber: 0.5 * delta)
SCALES = (1.0, 0.5, 2.0, 0.25, 4.0, 1.5, 3.0, 1.0 / 3.0)
_REL = 1e-6  # the traced number is the form in double, or of the scalar rounded to float32 (CELU: 1 / alpha)


def forms_of(sentinels: dict[float, str]) -> dict[float, tuple[str, str, float]]:
    """Every recognised number of every scalar: value -> (form, scalar field, scale). The
    unscaled forms first: where two entries meet, the simpler one is kept."""
    table: dict[float, tuple[str, str, float]] = {}
    for scale in SCALES:
        for value, name in sentinels.items():
            for form, (fn, _) in FORMS.items():
                try:
                    number = fn(value)
                except (ValueError, ZeroDivisionError):  # outside the form's domain at this value
                    continue
                table.setdefault(scale * number, (form, name, scale))
    return table


def match(value: float, table: dict[float, tuple[str, str, float]]) -> tuple[str, str, float] | None:
    """The (form, scalar, scale) a traced float is, if any: the closest within its form's reach."""
    if value in table:
        return table[value]
    best, distance = None, math.inf
    for known, hit in table.items():
        reach = (COMPOSED_REL if hit[0] in COMPOSED else _REL) * abs(known)
        if known != 0.0 and abs(value - known) <= reach and abs(value - known) < distance:
            best, distance = hit, abs(value - known)
    return best


def _numbers(arg) -> list:
    """The numbers among a node's arguments (ints too: int(alpha) or round(alpha) at trace time)."""
    if isinstance(arg, (float, int)) and not isinstance(arg, bool):
        return [arg]
    if isinstance(arg, (list, tuple)):
        return [f for a in arg for f in _numbers(a)]
    if isinstance(arg, dict):
        return [f for a in arg.values() for f in _numbers(a)]
    return []


def differing_constants(first: torch.fx.GraphModule, second: torch.fx.GraphModule,
                        table_first: dict, table_second: dict) -> str | None:
    """Why two traces of one reference, made with different sentinels, do not differ only in
    recognised numbers of the scalars (None: they do). Each float that changed must be the
    same form of the same scalar in both."""
    nodes_a, nodes_b = list(first.graph.nodes), list(second.graph.nodes)
    if len(nodes_a) != len(nodes_b) or any(a.target != b.target for a, b in zip(nodes_a, nodes_b)):
        return "its graph changes with the scalar's value (a Python branch on a scalar)"
    for a, b in zip(nodes_a, nodes_b):
        if a.op == "get_attr":  # a tensor built from a scalar (torch.tensor(alpha)) is a constant of the trace
            ta, tb = getattr(first, a.target, None), getattr(second, b.target, None)
            if isinstance(ta, torch.Tensor) and isinstance(tb, torch.Tensor) and \
                    (ta.shape != tb.shape or not bool(torch.equal(ta, tb))):
                return "a tensor built from a scalar's value while tracing (torch.tensor(alpha))"
            continue
        numbers_a, numbers_b = _numbers((a.args, a.kwargs)), _numbers((b.args, b.kwargs))
        if len(numbers_a) != len(numbers_b):
            return f"{a.target}'s arguments change with the scalar's value"
        for x, y in zip(numbers_a, numbers_b):
            if x == y:
                continue
            hit = match(x, table_first) if isinstance(x, float) else None
            if hit is None or not isinstance(y, float) or match(y, table_second) != hit:
                return (f"{a.target} takes {x!r}, a number computed from a scalar in a way the built-in "
                        f"generator cannot express (it knows {', '.join(FORMS)}, times "
                        f"{', '.join(f'{k:g}' for k in SCALES[1:])})")
    return None
