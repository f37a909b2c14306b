"""The kernel spec: a YAML file validated into a `KernelSpec`.

Every error names the file, the line (and column where known) and the field, and says how
to fix it. Validation here needs no GPU; running the reference is `reference.py`'s job.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import math
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .abi import ABI_VERSION, MAX_DIMS
from .errors import Location, SpecError, UsageError
from .names import name_problem
from .replaces import Replaces, check_replaces
from .saved import check_saved
from .signature import FLOAT_DTYPES, Signature, SignatureSyntaxError, parse_signature
from .yamlpos import Positions, load_yaml_with_positions

FloatDtype = Literal["float32", "float16", "bfloat16", "float64"]
Library = Literal["cublas", "cublasLt", "cudnn", "cufft", "curand", "cusparse", "cusolver"]

# The largest size a dim range, a literal size or a benchmark shape may name: 2**31 - 1
# elements along one axis (kernels index rows and columns in 32 bits, and an unbounded range
# is a typo, not a shape).
MAX_DIM_SIZE = 2**31 - 1

# Defaults per working dtype; the verifier widens them to 4x the reference's own error.
DEFAULT_TOLERANCE = {
    "float64": (1e-10, 1e-10),
    "float32": (1e-5, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (8e-3, 8e-3),
}


class Tolerance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


class PartialTolerance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    atol: float | None = Field(default=None, ge=0)
    rtol: float | None = Field(default=None, ge=0)


class KernelSpec(BaseModel):
    """A validated spec. `signature` is the parsed Signature; `path` the YAML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    signature_text: str = Field(alias="signature")
    dtypes: list[FloatDtype] = Field(min_length=1)
    dims: dict[str, tuple[int, int]] = Field(default_factory=dict)
    reference_source: str = Field(alias="reference")
    backward: Literal["kernel", "reference", "none"] = "none"
    tolerance: dict[FloatDtype, PartialTolerance] = Field(default_factory=dict)
    benchmark: list[dict[str, int]] = Field(default_factory=list)
    deterministic: bool = True
    libraries: list[Library] = Field(default_factory=list)
    replaces: list[Replaces] = Field(default_factory=list)  # specgen/replaces.py: the package's layers
    saved: dict[str, str] = Field(default_factory=dict)  # specgen/saved.py: per-row values the backward reads
    no_grad: list[str] = Field(default_factory=list)  # floating inputs the backward gives no gradient

    @field_validator("replaces", mode="before")
    @classmethod
    def _one_replacement_or_a_list(cls, value):
        return [value] if isinstance(value, dict) else value

    @field_validator("dims", mode="before")
    @classmethod
    def _dims_as_ranges(cls, value):
        # `D: 4096` fixes a dim; `D: [1, 4096]` is an inclusive range.
        if isinstance(value, dict):
            return {k: (v, v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in value.items()}
        return value

    # Set by load_spec, not by YAML.
    path: Path | None = Field(default=None, exclude=True)
    reference_line: int = Field(default=1, exclude=True)  # YAML line of the reference's first line
    signature_line: int = Field(default=1, exclude=True)  # YAML line of the signature
    dims_line: int = Field(default=1, exclude=True)  # YAML line of dims (the signature's when there is none)
    saved_lines: dict[str, int] = Field(default_factory=dict, exclude=True)  # YAML line of each saved value

    @cached_property
    def signature(self) -> Signature:
        parsed = parse_signature(self.signature_text)
        return parsed.without_grads(self.no_grad) if self.no_grad else parsed

    @cached_property
    def saved_values(self):
        """The `saved:` declarations parsed (specgen/saved.py), in declaration order."""
        from .saved import saved_values

        return saved_values(self)

    @property
    def op(self) -> str:
        return self.name

    def tolerance_for(self, dtype: str) -> Tolerance:
        atol, rtol = DEFAULT_TOLERANCE[dtype]
        given = self.tolerance.get(dtype)
        if given is not None:
            atol = given.atol if given.atol is not None else atol
            rtol = given.rtol if given.rtol is not None else rtol
        return Tolerance(atol=atol, rtol=rtol)

    def canonical(self) -> dict:
        """The parsed spec as plain data: what the lock's spec hash covers."""
        data = self.model_dump(mode="json", by_alias=True)
        # the kernel's contract: a batch group `*N` is the one axis N to the kernel, its ABI and its
        # verification, so writing `*N` for `N` leaves the hash (and a verified lock) as it was
        data["signature"] = str(self.signature.rows())
        data["abi_version"] = ABI_VERSION
        data.pop("replaces", None)  # the Python layers only: the kernel and its verification do not depend on it
        # in order (it is the ABI's field order); absent when none, so the hash of a spec without them is as before
        saved = data.pop("saved", None)
        if saved:
            data["saved"] = [[name, text] for name, text in saved.items()]
        if not data.get("no_grad"):
            data.pop("no_grad", None)
        _add_reference_fingerprint(self, data)
        return data

    def hash(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def reference_fn(self):
        from .reference import load_reference

        return load_reference(self)


def _add_reference_fingerprint(spec: KernelSpec, data: dict) -> None:
    """An import-path reference (`reference: pkg.mod:fn`): the hash also covers the module's file."""
    from .reference_import import reference_fingerprint

    fingerprint = reference_fingerprint(spec)
    if fingerprint is not None:
        data["reference_import"] = fingerprint


SPEC_FIELDS = [name if f.alias is None else f.alias for name, f in KernelSpec.model_fields.items()
               if name not in ("path", "reference_line", "signature_line", "dims_line", "saved_lines")]


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""


def _check_keys(data: dict, pos: Positions) -> None:
    for key in data:
        if key not in SPEC_FIELDS:
            raise SpecError(f"unknown key {key!r}", location=pos.location((key,), value=False), field=str(key),
                            hint=f"{_suggest(str(key), SPEC_FIELDS)}the keys of a spec are: {', '.join(SPEC_FIELDS)}")
    missing = [k for k in ("name", "description", "signature", "dtypes", "reference") if k not in data]
    if missing:
        raise SpecError(f"missing required key(s): {', '.join(missing)}", location=Location(pos.path, 1, 1),
                        field=missing[0], hint="`specgen init NAME` writes a commented starter spec")


def _pydantic_error(error: ValidationError, pos: Positions) -> SpecError:
    first = error.errors()[0]
    loc = tuple(first["loc"])
    field_path = tuple(("signature" if p == "signature_text" else "reference" if p == "reference_source" else p)
                       for p in loc)
    if field_path[:2] == ("replaces", 0) and ("replaces", 0) not in pos.values:
        field_path = field_path[:1] + field_path[2:]  # one mapping, not a list: no index in the YAML
    message = first["msg"]
    hints = {
        "dtypes": f"list working dtypes from {', '.join(FLOAT_DTYPES)}",
        "tolerance": "per dtype, e.g. tolerance: {bfloat16: {atol: 2e-2, rtol: 2e-2}}",
        "dims": "each symbol maps to [lo, hi] (inclusive) or one fixed size, e.g. dims: {N: [1, 4096], D: 768}",
        "benchmark": "a list of shapes, e.g. benchmark: [{N: 16384, D: 4096}]",
        "backward": "one of kernel, reference, none",
        "libraries": "libraries a kernel may call: cublas, cublasLt, cudnn, cufft, curand, cusparse, cusolver",
        "saved": 'e.g. saved: {lse: "Tensor[N] float32 = torch.logsumexp(logits.float(), dim=-1)"}',
        "no_grad": "a list of floating input names, e.g. no_grad: [cos, sin]",
        "replaces": "e.g. replaces: {layer: RMSNorm, modules: [transformers.models.llama.modeling_llama.LlamaRMSNorm], "
                    "args: {x: hidden_states, weight: self.weight, eps: self.variance_epsilon}} (README: Layers)",
    }
    if first["type"] == "literal_error" and "input" in first:
        message = f"{first['input']!r} is not allowed: {message.lower()}"
    elif "input" in first and first["type"] not in ("missing",):
        message = f"{message} (got {first['input']!r})"
    return SpecError(message, location=pos.location(field_path), field=".".join(str(p) for p in field_path),
                     hint=hints.get(str(field_path[0])))


def _signature_error(error: SignatureSyntaxError, spec_text: str, pos: Positions) -> SpecError:
    loc = pos.location(("signature",))
    style = pos.styles.get(("signature",))
    if style in (None, '"', "'") and "\n" not in spec_text.strip():
        loc = Location(loc.path, loc.line, (loc.column or 1) + error.offset + (1 if style else 0))
    return SpecError(f"{error.message}\n    {error.caret().replace(chr(10), chr(10) + '    ')}",
                     location=loc, field="signature",
                     hint="see the signature language in README.md: "
                          "op(x: Tensor[N, D], w: Tensor[D], eps: float = 1e-5) -> Tensor[N, D]")


def _name_offset(text: str, name: str, start: int = 0) -> int:
    """0-based offset of `name` as a whole word in the signature text (0 when not found)."""
    import re

    match = re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text[start:])
    return start + match.start() if match else 0


def _at_signature(message: str, name: str, spec: KernelSpec, pos: Positions, *, start: int = 0,
                  hint: str | None = None) -> SpecError:
    """A SpecError pointing at `name` inside the signature (line, column and a caret)."""
    text = spec.signature_text
    error = _signature_error(SignatureSyntaxError(message, _name_offset(text, name, start), text), text, pos)
    if hint:
        error.hint = hint
    return error


def _check_names(spec: KernelSpec, pos: Positions) -> None:
    """Every name becomes Python, C and a file name: keywords, macros and clashes are refused."""
    sig = spec.signature
    if problem := name_problem(spec.name, "op"):
        raise SpecError(problem, location=pos.location(("name",)), field="name",
                        hint="rename the op (in name: and in the signature)")
    arrow = spec.signature_text.find("->")
    named = [(p.name, "parameter", 0) for p in sig.params]
    named += [(o.name, "output", max(arrow, 0)) for o in sig.outputs if o.named]
    named += [(s, "dimension", 0) for s in sig.symbols()]
    for name, role, start in named:
        if problem := name_problem(name, role):
            raise _at_signature(f"{role} {name!r}: {problem}", name, spec, pos, start=start,
                                hint=f"rename the {role}")
    if spec.backward != "none":
        taken = {p.name for p in sig.params} | {o.name for o in sig.outputs} | set(sig.symbols())
        grads = [p.name for p in sig.inputs if p.type.differentiable] + [o.name for o in sig.outputs if o.type.is_floating]
        for name in grads:
            if f"grad_{name}" in taken:
                raise _at_signature(f"{'grad_' + name!r} is also the name of the gradient of {name!r} in the "
                                    f"backward pass", f"grad_{name}", spec, pos,
                                    hint="rename it: names grad_<x> are taken by the gradients of x")


def _check_sizes(spec: KernelSpec, pos: Positions) -> None:
    """Rank and literal sizes within what the kernel ABI and a real tensor can hold."""
    sig = spec.signature
    arrow = max(spec.signature_text.find("->"), 0)
    tensors = [(p.name, p.type, 0) for p in sig.inputs] + [(o.name, o.type, arrow) for o in sig.outputs]
    for name, ttype, start in tensors:
        if ttype.ndim > MAX_DIMS:
            raise _at_signature(f"{name!r} has {ttype.ndim} dimensions; the kernel ABI allows at most {MAX_DIMS}",
                                name, spec, pos, start=start, hint="merge dimensions, e.g. Tensor[N, D]")
        dims = list(ttype.dims) + list(ttype.value_range or ())
        for dim in dims:
            if max(abs(dim.add), dim.mul, dim.div) > MAX_DIM_SIZE:
                raise _at_signature(f"the size {dim} of {name!r} is larger than {MAX_DIM_SIZE}", name, spec, pos,
                                    start=start)
    for param in sig.scalars:
        if isinstance(param.default, float) and not math.isfinite(param.default):
            raise _at_signature(f"the default of {param.name!r} is {param.default}; a default must be a finite "
                                f"number (the package's torch schema cannot express it)", param.name, spec, pos,
                                hint="give a finite default, or none (then every call passes a value)")


def _check_lists(spec: KernelSpec, pos: Positions) -> None:
    seen: dict[str, int] = {}
    for index, dtype in enumerate(spec.dtypes):
        if dtype in seen:
            raise SpecError(f"{dtype} is listed twice", location=pos.location(("dtypes", index)),
                            field=f"dtypes[{index}]", hint="list each working dtype once")
        seen[dtype] = index


# What each integer dtype holds: an index range past it cannot be passed in that dtype
INT_LIMITS = {"int8": (-(1 << 7), (1 << 7) - 1), "uint8": (0, 255), "int16": (-(1 << 15), (1 << 15) - 1),
              "int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1)}


def _extreme(dim, dims: dict, end: int) -> int:
    """`dim` at dims' lower (end 0) or upper (end 1) bounds: symbol * mul / div + add grows with its symbol."""
    if dim.symbol is None:
        return dim.add
    return dims[dim.symbol][end] * dim.mul // dim.div + dim.add


def _check_value_ranges(spec: KernelSpec, pos: Positions) -> None:
    """An integer input's `in [lo, hi)` fits its dtype at every size dims allows."""
    for p in spec.signature.inputs:
        ttype = p.type
        if not ttype.value_range or ttype.dtype not in INT_LIMITS:
            continue
        low, high = _extreme(ttype.value_range[0], spec.dims, 0), _extreme(ttype.value_range[1], spec.dims, 1) - 1
        least, most = INT_LIMITS[ttype.dtype]
        if low < least or high > most:
            lo, hi = ttype.value_range
            end, bound = (0, lo) if low < least else (1, hi)
            at = f" (at {bound.symbol} = {spec.dims[bound.symbol][end]})" if bound.symbol else ""
            raise _at_signature(f"{p.name!r} is {ttype.dtype} but its values in [{lo}, {hi}) reach "
                                f"{low if end == 0 else high}{at}; {ttype.dtype} holds {least}..{most}",
                                p.name, spec, pos,
                                hint="use a wider integer dtype (int32, int64), or lower the bound in dims")


def _check_no_grad(spec: KernelSpec, pos: Positions) -> None:
    """`no_grad:` names floating tensor inputs, each once, of an op with a backward."""
    if not spec.no_grad:
        return
    if spec.backward == "none":
        raise SpecError("no_grad is given but the op has no backward (backward: none)",
                        location=pos.location(("no_grad",)), field="no_grad",
                        hint="remove no_grad, or give the op a backward (backward: kernel | reference)")
    inputs = {p.name: p for p in spec.signature.inputs}
    floating = [name for name, p in inputs.items() if p.type.is_floating]
    seen: set[str] = set()
    for index, name in enumerate(spec.no_grad):
        where = pos.location(("no_grad", index))
        if name in seen:
            raise SpecError(f"{name!r} is listed twice", location=where, field=f"no_grad[{index}]",
                            hint="list each input once")
        seen.add(name)
        if name not in inputs or not inputs[name].type.is_floating:
            what = "an integer input (it has no gradient anyway)" if name in inputs else "not a tensor input"
            raise SpecError(f"no_grad: {name!r} is {what}", location=where, field=f"no_grad[{index}]",
                            hint=f"{_suggest(name, floating)}list floating tensor inputs: {', '.join(floating)}")


def _check_semantics(spec: KernelSpec, pos: Positions) -> None:
    sig = spec.signature
    if sig.name != spec.name:
        raise SpecError(f"the signature names the op {sig.name!r} but name is {spec.name!r}",
                        location=pos.location(("signature",)), field="signature",
                        hint="use the same identifier in both places")
    _check_names(spec, pos)
    _check_sizes(spec, pos)
    _check_lists(spec, pos)
    symbols = sig.symbols()
    missing = [s for s in symbols if s not in spec.dims]
    if missing:
        raise SpecError(f"no range given for dimension(s) {', '.join(missing)}",
                        location=pos.location(("dims",), value=False) if ("dims",) in pos.keys
                        else Location(pos.path, 1, 1), field="dims",
                        hint="add e.g. dims: {" + ", ".join(f"{s}: [1, 4096]" for s in missing) + "}")
    divisors = sig.symbol_divisors()
    for symbol, (lo, hi) in spec.dims.items():
        where = pos.location(("dims", symbol))
        if symbol not in symbols:
            raise SpecError(f"dimension {symbol!r} does not appear in the signature", location=where,
                            field=f"dims.{symbol}",
                            hint=f"{_suggest(symbol, symbols)}the signature's dimensions are: {', '.join(symbols)}")
        if lo < 0 or hi < lo:
            raise SpecError(f"range [{lo}, {hi}] is empty or negative", location=where, field=f"dims.{symbol}",
                            hint="write [lo, hi] with 0 <= lo <= hi")
        if hi > MAX_DIM_SIZE:
            raise SpecError(f"the upper bound {hi} is larger than {MAX_DIM_SIZE}", location=where,
                            field=f"dims.{symbol}",
                            hint="give the largest size the op must handle, e.g. [1, 65536]")
        step = divisors.get(symbol, 1)
        if hi // step * step < lo:
            raise SpecError(f"no size in [{lo}, {hi}] is a multiple of {step}, which the signature needs",
                            location=where, field=f"dims.{symbol}")
    for index, shape in enumerate(spec.benchmark):
        where = pos.location(("benchmark", index))
        for symbol in symbols:
            if symbol not in shape:
                raise SpecError(f"benchmark shape {index + 1} does not set {symbol!r}", location=where,
                                field=f"benchmark[{index}]", hint=f"give every dimension: {', '.join(symbols)}")
        for symbol, value in shape.items():
            if symbol not in symbols:
                raise SpecError(f"benchmark shape {index + 1} sets unknown dimension {symbol!r}", location=where,
                                field=f"benchmark[{index}]", hint=f"{_suggest(symbol, symbols)}")
            lo, hi = spec.dims[symbol]
            if not lo <= value <= hi:
                raise SpecError(f"benchmark {symbol}={value} is outside dims.{symbol} = [{lo}, {hi}]",
                                location=pos.location(("benchmark", index, symbol)),
                                field=f"benchmark[{index}].{symbol}",
                                hint="a benchmark shape must be one the kernel is verified for: widen dims "
                                     "or change the shape")
            if value % divisors.get(symbol, 1):
                raise SpecError(f"benchmark {symbol}={value} is not a multiple of {divisors[symbol]}",
                                location=where, field=f"benchmark[{index}]")
    _check_value_ranges(spec, pos)
    _check_no_grad(spec, pos)
    if spec.backward == "kernel":
        if not any(p.type.differentiable for p in sig.inputs):
            raise SpecError("backward: kernel needs a floating input to differentiate"
                            + (" (every floating input is in no_grad)" if spec.no_grad else ""),
                            location=pos.location(("backward",)), field="backward", hint="use backward: none")
    check_replaces(spec, pos)
    check_saved(spec, pos)


def load_spec(path: str | Path) -> KernelSpec:
    """Read and validate one spec file. Raises SpecError pointing into the file."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    data, pos = load_yaml_with_positions(path)
    if not isinstance(data, dict):
        raise SpecError("a spec is a YAML mapping of keys (name, description, signature, ...)",
                        location=Location(path, 1, 1), hint="`specgen init NAME` writes a starter spec")
    _check_keys(data, pos)
    for key in ("signature", "reference", "description", "name"):
        if not isinstance(data.get(key), str):
            raise SpecError(f"{key} must be text (got {type(data.get(key)).__name__})",
                            location=pos.location((key,)), field=key)
    reference_line = pos.values[("reference",)][0] + (1 if pos.styles.get(("reference",)) in ("|", ">") else 0)
    saved = data.get("saved") if isinstance(data.get("saved"), dict) else {}  # else pydantic says what is wrong
    saved_lines = {name: pos.values[("saved", name)][0] for name in saved if ("saved", name) in pos.values}
    try:
        spec = KernelSpec.model_validate({**data, "path": path, "reference_line": reference_line,
                                          "signature_line": pos.values[("signature",)][0], "saved_lines": saved_lines,
                                          "dims_line": pos.values.get(("dims",), pos.values[("signature",)])[0]})
    except ValidationError as error:
        raise _pydantic_error(error, pos) from None
    try:
        spec.signature
    except SignatureSyntaxError as error:
        raise _signature_error(error, data["signature"], pos) from None
    _check_semantics(spec, pos)
    return spec


def find_spec_files(paths: list[str | Path]) -> list[Path]:
    """Spec files named or found (non-recursively, *.yaml / *.yml) in the folders named."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
            if not files:
                raise UsageError(f"{path}: no spec files (*.yaml) in this folder; "
                                 f"`specgen init NAME` writes one")
            found += files
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder")
    return found
