"""What a generated package's layers need at run time; emitted verbatim as <package>/_patching.py.

A plain module (no template): specgen's tests import it directly. It knows nothing about a
particular package: the generated layers.py hands it the op's function, the op's data from
_spec_data.OPS and the table of which module classes each layer stands in for.

- `call` runs an op on tensors with leading batch dims ([batch, seq, hidden] in a model):
  they are folded into the op's first axis and restored on the outputs.
- `patch` swaps the forward of every matching module of a model for a layer's forward, as
  the HF `kernels` library's `kernelize` does (the module keeps its parameters, buffers and
  state_dict; only `forward` changes). `unpatch` restores it.
"""
from __future__ import annotations

from types import MethodType

import torch

PATCHED_ATTR = "_specgen_patched"  # on a patched module: (layer name, the forward it had before)


def _row_symbol(dims) -> str | None:
    """The symbol of a tensor's first axis when that axis is a plain symbol (N, not 2*N or 4)."""
    if not dims:
        return None
    symbol, mul, div, add = dims[0]
    return symbol if symbol is not None and (mul, div, add) == (1, 1, 0) else None


def call(fn, op: dict, values: dict, returns=None, single: bool = False):
    """fn(**values), where tensors may carry leading batch dims the op's signature lacks.

    An input declared [N, D] given as [B, S, D] runs as [B*S, D]; every output whose first
    axis is N comes back as [B, S, ...]. All inputs that carry extra dims must agree on them
    (and on the symbol of their first axis). `returns` picks outputs by index; `single`
    returns one tensor rather than a tuple."""
    lead, row = None, None
    values = dict(values)
    for spec in op["inputs"]:
        value = values.get(spec["name"])
        if not isinstance(value, torch.Tensor):
            continue
        declared = len(spec["dims"])
        extra = value.dim() - declared
        if extra <= 0:
            continue
        symbol = _row_symbol(spec["dims"])
        if symbol is None:
            raise ValueError(f"{op['name']}: {spec['name']} has {value.dim()} dims, the op takes {declared} "
                             f"({op['signature']}); its first axis is not a plain size, so leading dims "
                             f"cannot be folded into it")
        shape = tuple(value.shape[:extra + 1])
        if lead is None:
            lead, row = shape, symbol
        elif shape != lead or symbol != row:
            raise ValueError(f"{op['name']}: {spec['name']} has leading dims {list(shape)}, another input "
                             f"{list(lead)}; inputs with extra leading dims must agree on them")
        values[spec["name"]] = value.reshape((-1,) + tuple(value.shape[extra + 1:]))
    result = fn(**values)
    outs = list(result) if isinstance(result, tuple) else [result]
    if lead is not None:
        for index, spec in enumerate(op["outputs"]):
            if _row_symbol(spec["dims"]) == row and isinstance(outs[index], torch.Tensor):
                outs[index] = outs[index].reshape(lead + tuple(outs[index].shape[1:]))
    if returns is not None:
        outs = [outs[i] for i in returns]
    if single:
        return outs[0]
    if returns is None and isinstance(result, tuple) and hasattr(result, "_fields"):
        return type(result)(*outs)  # the op's named tuple
    return tuple(outs)


def class_names(cls) -> list[str]:
    """`module.QualName` of a class and of its bases: a layer declared for a base class also
    stands in for its subclasses."""
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]


def _attribute(module, path: str):
    value = module
    for part in path.split(".")[1:]:  # "self.weight" -> weight
        value = getattr(value, part)
    return value


def patch(model, replaces: dict, layers: dict, *, only=None, package: str = "") -> list[str]:
    """Swap the forward of every module of `model` (itself included) whose class, or a base
    class, is a key of `replaces` (class path -> layer name) for that layer's forward.

    `layers` maps layer name -> (layer class, its `self.` attributes); `only` limits the swap
    to those layer names. Returns the names of the modules patched (`""` is `model` itself).
    A module that lacks an attribute the layer reads is an error naming it, raised before any
    module is changed. Patching twice is harmless."""
    if only is not None:
        only = {only} if isinstance(only, str) else set(only)
        unknown = sorted(only - set(layers))
        if unknown:
            raise ValueError(f"{package}.patch: no layer {', '.join(unknown)}; the layers are: "
                             f"{', '.join(sorted(layers)) or 'none'}")
    plan = []
    for name, module in model.named_modules():
        layer_name = next((replaces[c] for c in class_names(type(module)) if c in replaces), None)
        if layer_name is None or (only is not None and layer_name not in only):
            continue
        layer, attributes = layers[layer_name]
        for path in attributes:
            try:
                _attribute(module, path)
            except AttributeError:
                raise ValueError(f"{package}.patch: module {name or '(the model)'!r} "
                                 f"({type(module).__qualname__}) has no {path[len('self.'):]}, which "
                                 f"{package}.layers.{layer_name} reads; its spec's replaces: args say where each "
                                 f"op argument comes from") from None
        plan.append((name, module, layer_name, layer))
    for name, module, layer_name, layer in plan:
        before = module.__dict__.get(PATCHED_ATTR)
        original = before[1] if before else module.__dict__.get("forward")
        module.forward = MethodType(layer.forward, module)
        module.__dict__[PATCHED_ATTR] = (layer_name, original)
    return [name for name, *_ in plan]


def unpatch(model) -> list[str]:
    """Undo `patch` on every module of `model`; returns the names of the modules restored."""
    restored = []
    for name, module in model.named_modules():
        state = module.__dict__.pop(PATCHED_ATTR, None)
        if state is None:
            continue
        original = state[1]
        if original is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = original
        restored.append(name)
    return restored


def patched(model) -> dict[str, str]:
    """Module name -> the layer now running its forward."""
    return {name: module.__dict__[PATCHED_ATTR][0] for name, module in model.named_modules()
            if PATCHED_ATTR in module.__dict__}
