"""`math` functions of symbolic sizes kept symbolic while the reference is traced.

A reference that scales by its own size (`scores / math.sqrt(x.shape[-1])`, an attention's
1/sqrt(d)) calls `math.sqrt` on a SymInt; Python converts it with `float()`, which fixes the size
to its example value (the trace then holds at one size only, and is refused). While tracing, the
reference's module sees a `math` whose functions send a symbolic size to torch's symbolic
counterparts (`torch._sym_sqrt`, ...), which the tracer records as calls on sizes and the lowering
computes from the dims at run time. Anything else (a plain number) goes to the real function.

The swap is of names in the reference's own globals (`math`, or a function imported from it by
name), restored when the trace ends; no other module sees it.
"""
from __future__ import annotations

import contextlib
import math
import types

import torch

# math.<name> -> torch's symbolic function of the same meaning (torch/fx/experimental/sym_node.py), for
# the functions the lowering computes (lower.SYM_MATH: ops.py's sqrt, cos, sin, tanh, log2);
# any other math function of a size still fixes the size and is refused as before, naming it
SYMBOLIC = {name: getattr(torch, f"_sym_{name}") for name in ("sqrt", "cos", "sin", "tanh", "log2")
            if hasattr(torch, f"_sym_{name}")}


def _is_symbolic(value) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat))


def _wrapped(name: str, real):
    symbolic = SYMBOLIC[name]

    def fn(x):
        return symbolic(torch.sym_float(x)) if _is_symbolic(x) else real(x)

    fn.__name__ = name
    return fn


def _pow(x, y):
    if _is_symbolic(x) or _is_symbolic(y):
        return torch.sym_float(x) ** y
    return math.pow(x, y)


def _log(x, base=math.e):
    """log via torch's symbolic log2 (there is no symbolic natural log): log2(x) * ln(2) / ln(base)."""
    if not _is_symbolic(x):
        return math.log(x, base)
    return SYMBOLIC["log2"](torch.sym_float(x)) * (math.log(2.0) / math.log(base))


def _shim() -> types.ModuleType:
    shim = types.ModuleType("math", "math, with torch's symbolic functions for traced sizes")
    shim.__dict__.update({k: v for k, v in vars(math).items() if not k.startswith("__")})
    for name in SYMBOLIC:
        setattr(shim, name, _wrapped(name, getattr(math, name)))
    shim.pow = _pow
    if "log2" in SYMBOLIC:
        shim.log = _log
    return shim


SHIM = _shim()


@contextlib.contextmanager
def symbolic_math(fn):
    """While inside, `fn`'s globals see SHIM for `math` and for each math function bound by name."""
    namespace = getattr(fn, "__globals__", None)
    if namespace is None:
        yield
        return
    swapped = {}
    for key, value in list(namespace.items()):
        if value is math:
            swapped[key] = value
            namespace[key] = SHIM
        elif callable(value) and getattr(math, getattr(value, "__name__", ""), None) is value \
                and hasattr(SHIM, value.__name__) and getattr(SHIM, value.__name__) is not value:
            swapped[key] = value  # `from math import sqrt`
            namespace[key] = getattr(SHIM, value.__name__)
    try:
        yield
    finally:
        namespace.update(swapped)
