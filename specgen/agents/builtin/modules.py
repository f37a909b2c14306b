"""nn.Modules built inside a reference: their parameters and buffers are constants of the
reference, not inputs of the spec.

A reference such as `return torch.nn.LayerNorm(x.shape[-1])(x)` computes with the values
its own construction gives (LayerNorm: weight 1, bias 0; BatchNorm: running mean 0, var 1),
the same on every call, so the kernel may bake them in. While tracing, every nn.Module
subclass's own `__init__` and `Module._apply` (`.to()`, `.float()`, ...) run outside the
tracer (symbolic sizes passed in are replaced by their example values), so the module's
tensors are real tensors the graph reads as constants (fx `get_attr` nodes);
`constant_value` then gives the lowering the one value such a tensor is filled with. A
tensor that is not one constant fill (nn.Linear's random initialization, a seeded RNG) is
refused: weights that vary are inputs, and a spec declares them in its signature.
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


def _outside_tracer(fn):
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
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
