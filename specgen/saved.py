"""Saved intermediates: per-row statistics the forward stores for the backward.

A spec declares each one under `saved:` as `NAME: "Tensor[...] DTYPE = EXPRESSION"`: a shape in
the signature's symbolic dims, an optional dtype (none: the working dtype) and a Python
expression over the op's inputs and scalars, evaluated in the reference's namespace (its
imports and helpers). A saved value is a hidden output of the forward (`saved_<name>` in
`<op>_args`) and a read-only input of the backward (docs/ARCHITECTURE.md "Saved intermediates").
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

from .errors import Location, SpecError
from .names import name_problem
from .abi import MAX_DIMS
from .signature import SignatureSyntaxError, TensorType, parse_tensor_type

PREFIX = "saved_"  # a saved value's ABI field (and argument) name is PREFIX + its name
EXAMPLE = 'saved: {lse: "Tensor[N] float32 = torch.logsumexp(logits.float(), dim=-1)"}'


@dataclass(frozen=True)
class SavedValue:
    name: str
    type: TensorType
    expression: str
    line: int = 1  # the YAML line of the declaration: evaluation errors point there

    @property
    def field(self) -> str:
        return PREFIX + self.name

    def __str__(self) -> str:
        return f"{self.type} = {self.expression}"


def parse_saved(name: str, text: str) -> SavedValue:
    """`Tensor[N] float32 = expr` → SavedValue. SignatureSyntaxError (offset into `text`) when bad."""
    type_text, equals, expression = text.partition("=")
    if not equals or not expression.strip():
        raise SignatureSyntaxError("expected 'TYPE = EXPRESSION', e.g. Tensor[N] float32 = "
                                   "torch.logsumexp(logits.float(), dim=-1)", len(type_text.rstrip()), text)
    ttype = parse_tensor_type(type_text)
    if ttype.value_range is not None:
        raise SignatureSyntaxError("a saved value takes no value range", type_text.find(" in "), text)
    source = expression.strip()
    try:
        compile(source, "<saved>", "eval")
    except SyntaxError as error:
        raise SignatureSyntaxError(f"the expression is not valid Python: {error.msg}",
                                   len(type_text) + 1 + len(expression) - len(expression.lstrip())
                                   + max((error.offset or 1) - 1, 0), text) from None
    return SavedValue(name, ttype, source)


def _error_at(pos, name: str, message: str, offset: int = 0, hint: str | None = None) -> SpecError:
    where = pos.location(("saved", name))
    style = pos.styles.get(("saved", name))
    if offset and style in (None, '"', "'"):
        where = Location(where.path, where.line, (where.column or 1) + offset + (1 if style else 0))
    return SpecError(message, location=where, field=f"saved.{name}", hint=hint or f"e.g. {EXAMPLE}")


def check_saved(spec, pos) -> None:
    """Every declaration parses, names nothing taken, and sizes itself with the inputs' dims."""
    sig = spec.signature
    taken = ({p.name: "a parameter" for p in sig.params} | {o.name: "an output" for o in sig.outputs}
             | {s: "a dimension" for s in sig.symbols()})
    grads = {f"grad_{p.name}" for p in sig.inputs} | {f"grad_{o.name}" for o in sig.outputs}
    bound = sig.input_symbols()
    for name, text in spec.saved.items():
        if problem := name_problem(name, "saved value"):
            raise _error_at(pos, name, f"saved value {name!r}: {problem}", hint="rename the saved value")
        field = PREFIX + name
        for clash in (name, field):
            if clash in taken:
                raise _error_at(pos, name, f"saved value {name!r}: {clash!r} is already {taken[clash]} "
                                                 f"of the signature", hint="rename the saved value")
        if field in grads or name in grads:
            raise _error_at(pos, name, f"saved value {name!r} collides with a gradient's name",
                            hint="rename the saved value")
        try:
            value = parse_saved(name, text)
        except SignatureSyntaxError as error:
            raise _error_at(pos, name, f"{error.message}\n    {error.caret()}", error.offset) from None
        if len(value.type.dims) > MAX_DIMS:
            raise _error_at(pos, name, f"saved value {name!r} has {len(value.type.dims)} dimensions; the kernel ABI "
                                       f"allows at most {MAX_DIMS}")
        for dim in value.type.dims:
            if dim.symbol and dim.symbol not in bound:
                raise _error_at(pos, name, f"dimension {dim.symbol!r} of saved value {name!r} is not bound "
                                                 f"by any input", text.find(dim.symbol, text.find("[")),
                                hint=f"use the inputs' dimensions: {', '.join(sorted(bound))}")
    if spec.saved and spec.backward != "kernel":
        raise SpecError("saved values are for a backward kernel to read; this spec has backward: "
                        f"{spec.backward}", location=pos.location(("saved",), value=False), field="saved",
                        hint="drop saved:, or set backward: kernel")


def saved_values(spec) -> tuple[SavedValue, ...]:
    """The spec's saved values, in declaration order (load_spec has checked them)."""
    lines = getattr(spec, "saved_lines", None) or {}
    return tuple(SavedValue(v.name, v.type, v.expression, lines.get(v.name, spec.reference_line))
                 for v in (parse_saved(name, text) for name, text in spec.saved.items()))


def saved_dtype(value: SavedValue, working: str) -> str:
    return value.type.dtype_for(working)


def evaluate_saved(spec, args: dict, dtype: str) -> dict[str, object]:
    """Each saved value's definition on these arguments, by ABI field name: cast to its declared
    dtype, or to float64 for a floating value when `dtype` is float64 (the verifier's truth)."""
    import torch

    from .inputs import TORCH_DTYPES

    filename = str(spec.path or f"<{spec.name}>")
    out = {}
    with torch.no_grad(), (keep_float64() if dtype == "float64" else contextlib.nullcontext()):
        results = saved_expressions(spec, args)
    for value in saved_values(spec):
        result = results[value.field]
        if not isinstance(result, torch.Tensor):
            raise SpecError(f"saved value {value.name!r} is a {type(result).__name__}, not a tensor",
                            location=Location(filename, value.line), field=f"saved.{value.name}")
        if dtype == "float64" and value.type.is_floating and result.dtype != torch.float64:
            raise SpecError(f"saved value {value.name!r} comes back in {str(result.dtype).replace('torch.', '')} "
                            f"from float64 inputs, so the verifier's truth for it would not be float64",
                            location=Location(filename, value.line), field=f"saved.{value.name}",
                            hint="compute in the inputs' dtype or wider: e.g. "
                                 "x.to(torch.promote_types(x.dtype, torch.float32)) for a fixed cast")
        dims = _dims_of(spec, args)
        shape = value.type.shape(dims)
        if tuple(result.shape) != shape:
            raise SpecError(f"saved value {value.name!r} has shape {tuple(result.shape)}; its declaration "
                            f"{value.type} says {shape}", location=Location(filename, value.line),
                            field=f"saved.{value.name}", hint="make the expression's shape match the type")
        target = torch.float64 if dtype == "float64" and value.type.is_floating else TORCH_DTYPES[saved_dtype(value, dtype)]
        out[value.field] = result.detach().to(target).contiguous()
    return out


def _narrow_float(dtype) -> bool:
    import torch

    return isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype != torch.float64


@functools.cache
def _keep_float64_class():
    """The mode's class, built once (torch is imported only when a definition is evaluated)."""
    import torch
    from torch.overrides import TorchFunctionMode

    narrowing = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}

    class KeepFloat64(TorchFunctionMode):
        """For the truth run: a definition's casts of float64 tensors to a narrower floating dtype
        (`.float()`, `.half()`, `.bfloat16()`, `.to(torch.float32)`, `dtype=torch.float32`) stay in
        float64. A definition states the math; written for the working dtypes (`logits.float()`),
        its float64 run would otherwise compute the truth in float32."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            first = args[0] if args else None
            if func in narrowing and isinstance(first, torch.Tensor) and first.dtype == torch.float64:
                return first
            if func is torch.Tensor.to and isinstance(first, torch.Tensor) and first.dtype == torch.float64:
                args = tuple(torch.float64 if _narrow_float(a) else a for a in args)
            if _narrow_float(kwargs.get("dtype")):
                kwargs["dtype"] = torch.float64
            return func(*args, **kwargs)

    return KeepFloat64


def keep_float64():
    """A fresh KeepFloat64 mode (see its class)."""
    return _keep_float64_class()()


def saved_expressions(spec, args: dict) -> dict[str, object]:
    """Each definition evaluated as written on `args` (tensors and scalars by name), in the
    reference's namespace, by ABI field name: no cast, no check (the builtin generator traces
    this with symbolic sizes; evaluate_saved checks and casts)."""
    from .reference import reference_failure

    namespace = dict(spec.reference_fn().__globals__)
    filename = str(spec.path or f"<{spec.name}>")
    out = {}
    for value in saved_values(spec):
        code = compile("\n" * (value.line - 1) + value.expression, filename, "eval")
        try:
            out[value.field] = eval(code, {**namespace, **args})  # noqa: S307 - the spec's own code, as the reference
        except Exception as error:  # the user's expression: report it at its YAML line
            raise reference_failure(spec, error, f"while computing saved value {value.name!r}") from None
    return out


def _dims_of(spec, args: dict) -> dict[str, int]:
    """The symbolic dims from the input tensors' shapes."""
    dims: dict[str, int] = {}
    for param in spec.signature.inputs:
        for dim, size in zip(param.type.dims, args[param.name].shape):
            if dim.symbol and dim.symbol not in dims and (value := dim.invert(size)) is not None:
                dims[dim.symbol] = value
    return dims
