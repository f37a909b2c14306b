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
refused: weights that vary are inputs, and a spec declares them in its signature (or passes
them in through `torch.func.functional_call(module, {name: input}, ...)`, which replaces the
module's own tensors for the call: the constants are then read by nothing).

A module sized from a symbolic size (`nn.LayerNorm(x.shape[-1])`, a user's `Snake(x.shape[1])`)
is built under the tracer, its tensors traced with symbolic sizes. Two things of torch's own
module code do not take that as they are, and are adapted here:
- a lone size is given as a SymInt that is also a `numbers.Integral` (`IntegralSymInt`): torch's
  modules test sizes with `isinstance(n, numbers.Integral)` (LayerNorm and RMSNorm take an int for
  a one-axis shape, anything else for a shape to iterate); it computes as the SymInt it wraps.
- `.to()`, `.float()`, `.type()`, ... (`Module._apply`) on a module holding traced tensors converts
  each under the tracer and stores the result as the module's tensor (`_apply_traced`): torch
  swaps a fake parameter in place (`torch.utils.swap_tensors`), which the tracer's references to it
  forbid ("Couldn't swap Snake.alpha").
"""
from __future__ import annotations

import contextlib
import functools
import numbers

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


class IntegralSymInt(torch.SymInt):
    """A symbolic size that `isinstance(n, numbers.Integral)` takes for an int, as torch's modules
    test their sizes (nn.LayerNorm(x.shape[-1]): an int is a one-axis shape). It computes as the
    SymInt it wraps (same node, so the tracer knows it; its arithmetic gives plain SymInts)."""


numbers.Integral.register(IntegralSymInt)


def _integral(value):
    """`value` with each SymInt in it (through tuples, lists and sizes) an IntegralSymInt."""
    if isinstance(value, torch.SymInt) and not isinstance(value, IntegralSymInt):
        return IntegralSymInt(value.node)
    if type(value) in (tuple, list, torch.Size):  # a namedtuple or other sequence as it is
        return type(value)(_integral(v) for v in value)
    return value


def _outside():
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    stack = contextlib.ExitStack()
    stack.enter_context(disable_proxy_modes_tracing())
    stack.enter_context(unset_fake_temporarily())
    return stack


def _outside_tracer(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _symbolic(args) or _symbolic(tuple(kwargs.values())):
            # sized from a symbolic shape (nn.LayerNorm(x.shape[1:])): built under the tracer, so
            # its tensors keep symbolic sizes; their initialization (empty, then a fill copied
            # in) is lowered as the fill (lower.op_empty / op_copy_)
            return fn(*[_integral(a) for a in args], **{k: _integral(v) for k, v in kwargs.items()})
        with _outside():
            return fn(*[_concrete(a) for a in args], **{k: _concrete(v) for k, v in kwargs.items()})

    wrapper.__specgen_wrapped__ = True
    return wrapper


def _traced(tensor) -> bool:
    """A tensor the tracer made (a module's parameter built from a symbolic size), not a real one."""
    from torch._subclasses.fake_tensor import is_fake

    return isinstance(tensor, torch.Tensor) and is_fake(tensor)


def _holds_traced(module) -> bool:
    return any(_traced(t) for t in module.parameters()) or any(_traced(t) for t in module.buffers())


def _apply_traced(module, fn, recurse=True):
    """Module._apply for a module holding traced tensors: each child through its own _apply, each
    traced tensor converted under the tracer and stored anew (a new Parameter of the converted
    tensor, as torch does for a tensor of another type), each real one converted outside it and
    set in place (`param.data = ...`, as torch does)."""
    if recurse:
        for child in module.children():
            child._apply(fn)
    for key, param in module._parameters.items():
        if param is None:
            continue
        if _traced(param):
            with torch.no_grad():
                module._parameters[key] = torch.nn.Parameter(fn(param), param.requires_grad)
            continue
        with _outside(), torch.no_grad():
            applied = fn(param)
            if torch._has_compatible_shallow_copy_type(param, applied):
                param.data = applied
            else:
                module._parameters[key] = torch.nn.Parameter(applied, param.requires_grad)
    for key, buf in module._buffers.items():
        if buf is None:
            continue
        if _traced(buf):
            module._buffers[key] = fn(buf)
        else:
            with _outside():
                module._buffers[key] = fn(buf)
    return module


def _apply_wrapper(fn):
    """Module._apply: outside the tracer for a module of real tensors (`_outside_tracer`), tensor
    by tensor for one holding traced tensors (`_apply_traced`)."""
    outside = _outside_tracer(fn)

    @functools.wraps(fn)
    def wrapper(module, *args, **kwargs):
        if _holds_traced(module):
            return _apply_traced(module, *args, **kwargs)
        return outside(module, *args, **kwargs)

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
                setattr(cls, attr, (_apply_wrapper if attr == "_apply" else _outside_tracer)(fn))
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
