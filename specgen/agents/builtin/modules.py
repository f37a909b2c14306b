"""nn.Modules built inside a reference: their parameters and buffers are constants of the
reference, not inputs of the spec.

A reference such as `return torch.nn.LayerNorm(x.shape[-1:])(x)` computes with the values
its own construction gives (LayerNorm: weight 1, bias 0; BatchNorm: running mean 0, var 1),
the same on every call, so the kernel may bake them in. While tracing, every nn.Module
subclass's own `__init__` and `Module._apply` (`.to()`, `.float()`, ...) run outside the
tracer (symbolic sizes passed in are replaced by their example values), so the module's
tensors are real tensors the graph reads as constants (fx `get_attr` nodes);
`constant_value` then gives the lowering the one value such a tensor is filled with. A
tensor that is not one constant fill (nn.Linear's random initialization, a seeded RNG) is
refused: weights that vary are inputs, and a spec declares them in its signature.
(`nn.LayerNorm(x.shape[-1])`, one symbolic int, cannot be traced: nn.LayerNorm takes it for a
shape to iterate; the refusal says so. `x.shape[-1:]` or a literal size traces.)
"""
from __future__ import annotations

import contextlib
import functools

import torch


def _concrete(value):
    if isinstance(value, torch.SymInt):
        return int(value.node.hint)
    if isinstance(value, torch.SymFloat):
        return float(value.node.hint)
    if isinstance(value, (tuple, list)):
        return type(value)(_concrete(v) for v in value)
    return value


def _symbolic(values) -> bool:
    for v in values:
        if isinstance(v, (torch.SymInt, torch.SymFloat)):
            return True
        if isinstance(v, (tuple, list)) and _symbolic(v):
            return True
    return False


def _outside_tracer(fn):
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _symbolic(args) or _symbolic(tuple(kwargs.values())):
            # sized from a symbolic shape (nn.LayerNorm(x.shape[1:])): built under the tracer, so
            # its tensors keep symbolic sizes; their initialization (empty, then a fill copied
            # in) is lowered as the fill (lower.op_empty / op_copy_)
            return fn(*args, **kwargs)
        with disable_proxy_modes_tracing(), unset_fake_temporarily():
            return fn(*[_concrete(a) for a in args], **{k: _concrete(v) for k, v in kwargs.items()})

    wrapper.__specgen_wrapped__ = True
    return wrapper


def _module_classes():
    seen, stack = set(), [torch.nn.Module]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
    return seen


@contextlib.contextmanager
def modules_as_constants():
    """Within: modules built (and converted) by the traced reference hold real tensors."""
    patched = []
    try:
        for cls in _module_classes():
            for attr in ("__init__",) + (("_apply",) if cls is torch.nn.Module else ()):
                fn = cls.__dict__.get(attr)
                if fn is None or getattr(fn, "__specgen_wrapped__", False):
                    continue
                setattr(cls, attr, _outside_tracer(fn))
                patched.append((cls, attr, fn))
        yield
    finally:
        for cls, attr, fn in reversed(patched):
            setattr(cls, attr, fn)


def constant_value(tensor: torch.Tensor):
    """The one value `tensor` is filled with (a Python bool, int or float), or None."""
    if tensor.numel() == 0:
        return None
    flat = tensor.detach().reshape(-1)
    first = flat[0]
    if not bool((flat == first).all()) and not (first.is_floating_point() and bool(flat.isnan().all())):
        return None
    return first.item()


class Uninit:
    """A tensor from torch.empty (a module's parameter before its initialization): it may only
    be the destination of a copy, whose result is the copied value."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def lower_copy(lw, fx_node, dst, src):
    """aten.copy_ into a fresh torch.empty tensor: the copied value (a module's parameter
    initialized with a fill), a constant or global value only."""
    from .lower import Val

    got = lw.env.get(dst) if hasattr(dst, "op") else None
    if not isinstance(got, Uninit):
        raise lw.refuse(fx_node, "the op aten.copy_ (an in-place write, e.g. a module updating its buffers)")
    val = lw.value(src, fx_node)
    if val.node.level not in ("const", "global"):
        raise lw.refuse(fx_node, "the op aten.copy_ of a computed tensor into a fresh one")
    node = val.node
    if node.op == "const" and getattr(fx_node.meta.get("val"), "is_floating_point", lambda: False)():
        from .ir import const

        node = const(float(node.attrs["value"]), "float")  # full_like(p, 0) into a float parameter
    return Val(node, got.shape)
