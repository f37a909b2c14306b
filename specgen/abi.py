"""The kernel ABI: the one contract between a kernel and the framework.

From a spec's signature this module derives the argument structs of each direction and
renders them twice from the same field list: as a C header (`<op>_abi.h`, for kernels)
and as ctypes structures (for the verifier and benchmark, which call the kernel library
directly). Layout: docs/ARCHITECTURE.md "The kernel ABI".
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .signature import Param, TensorType

ABI_VERSION = 1
MAX_DIMS = 8
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int64": 4, "int32": 5,
               "int16": 6, "int8": 7, "uint8": 8, "bool": 9}
SCALAR_CTYPES = {"float": ("double", ctypes.c_double), "int": ("int64_t", ctypes.c_int64),
                 "bool": ("bool", ctypes.c_bool)}
DIRECTIONS = ("forward", "backward")
# The framework's scratch memory for one call, appended after every other field so that a kernel
# compiled before they existed reads the same offsets (docs/ARCHITECTURE.md "Workspaces").
WORKSPACE_FIELDS = ("workspace", "workspace_bytes")
WORKSPACE = WORKSPACE_FIELDS[0]  # the key of a call's workspace among its tensors (verifier, benchmark)


@dataclass(frozen=True)
class AbiField:
    name: str
    role: str  # input | scalar | dim | output | saved | fwd_output | saved_input | grad_output | grad_input | workspace
    tensor: TensorType | None = None  # tensor fields
    scalar: Param | None = None  # scalar fields

    @property
    def is_tensor(self) -> bool:
        return self.tensor is not None

    @property
    def written(self) -> bool:
        """Does the kernel write this field's tensor?"""
        return self.role in ("output", "saved", "grad_input")

    def c_type(self) -> str:
        if self.is_tensor:
            return "specgen_tensor"
        if self.name == "workspace":
            return "void*"
        if self.role in ("dim", "workspace"):
            return "int64_t"
        return SCALAR_CTYPES[self.scalar.type.kind][0]

    def ctype(self):
        if self.is_tensor:
            return SpecgenTensor
        if self.name == "workspace":
            return ctypes.c_void_p
        if self.role in ("dim", "workspace"):
            return ctypes.c_int64
        return SCALAR_CTYPES[self.scalar.type.kind][1]


class SpecgenTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("sizes", ctypes.c_int64 * MAX_DIMS),
                ("strides", ctypes.c_int64 * MAX_DIMS), ("ndim", ctypes.c_int32), ("dtype", ctypes.c_int32)]


def struct_name(spec, direction: str) -> str:
    return f"{spec.name}_args" if direction == "forward" else f"{spec.name}_bwd_args"


def entry_point(spec, direction: str) -> str:
    return f"{spec.name}_{direction}"


def workspace_function(spec, direction: str) -> str:
    """The optional size function of `direction`: `size_t <op>_<direction>_workspace(const args*)`."""
    return f"{entry_point(spec, direction)}_workspace"


def names_workspace_function(spec, source: str, direction: str) -> bool:
    """Does a kernel's source spell out the size function of `direction` (the package's binding
    calls it only then; the gate refuses a kernel that defines it under another spelling)?"""
    return re.search(rf"\b{re.escape(workspace_function(spec, direction))}\b", source) is not None


def workspace_function_problems(spec, source: str, defined: set[str]) -> list[str]:
    """The package's binding calls a size function only where the source spells its name: one
    defined under another spelling would never be called (its kernel left without a workspace),
    one named but not defined would not link. `defined`: the compiled kernel's symbols."""
    problems = []
    for direction in DIRECTIONS:
        function = workspace_function(spec, direction)
        named = names_workspace_function(spec, source, direction)
        if function in defined and not named:
            problems.append(f"it defines {function} without spelling its name out in the source (a macro?): "
                            f"write `extern \"C\" size_t {function}(...)` so that a package calls it")
        elif named and function not in defined:
            problems.append(f"it names {function} but does not define it with C linkage")
    return problems


def header_filename(spec) -> str:
    return f"{spec.name}_abi.h"


def has_backward_kernel(spec) -> bool:
    return spec.backward == "kernel"


def grad_output_names(spec) -> list[str]:
    """`grad_<out>` for each floating output: the gradients the backward kernel reads."""
    return [f"grad_{o.name}" for o in spec.signature.outputs if o.type.is_floating]


def grad_input_names(spec) -> list[str]:
    """`grad_<in>` for each floating input not in `no_grad:`: the gradients the backward kernel writes."""
    return [f"grad_{p.name}" for p in spec.signature.inputs if p.type.differentiable]


def fields(spec, direction: str = "forward") -> list[AbiField]:
    """The struct's fields in ABI order. A batch group `*B` is the one axis B here: the package
    folds the leading dims before the kernel, which never sees them."""
    sig = spec.signature
    out: list[AbiField] = [AbiField(p.name, "input", tensor=p.type.rows()) for p in sig.inputs]
    out += [AbiField(p.name, "scalar", scalar=p) for p in sig.scalars]
    out += [AbiField(s, "dim") for s in sig.symbols()]
    # saved intermediates (docs/ARCHITECTURE.md "Saved intermediates"): written by the forward after
    # its outputs, read by the backward after the forward outputs; none: the fields are as before
    saved = getattr(spec, "saved_values", ())
    if direction == "forward":
        out += [AbiField(o.name, "output", tensor=o.type.rows()) for o in sig.outputs]
        out += [AbiField(v.field, "saved", tensor=v.type.rows()) for v in saved]
    elif direction == "backward":
        out += [AbiField(o.name, "fwd_output", tensor=o.type.rows()) for o in sig.outputs]
        out += [AbiField(v.field, "saved_input", tensor=v.type.rows()) for v in saved]
        out += [AbiField(f"grad_{o.name}", "grad_output", tensor=o.type.rows())
                for o in sig.outputs if o.type.is_floating]
        out += [AbiField(f"grad_{p.name}", "grad_input", tensor=p.type.rows())
                for p in sig.inputs if p.type.differentiable]
    else:
        raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
    out += [AbiField(name, "workspace") for name in WORKSPACE_FIELDS]
    return out


# ------------------------------------------------------------------------ C header

_COMMON = f"""\
#ifndef SPECGEN_ABI_COMMON
#define SPECGEN_ABI_COMMON 1
#define SPECGEN_ABI_VERSION {ABI_VERSION}
#define SPECGEN_MAX_DIMS {MAX_DIMS}
/* dtype codes of specgen_tensor.dtype */
typedef enum specgen_dtype {{
  {", ".join(f"SPECGEN_{k.upper()} = {v}" for k, v in DTYPE_CODES.items())}
}} specgen_dtype;
/* One tensor argument. `data` is a device pointer to element [0, ..., 0]; it may be an
   offset view, so check its alignment before vector loads. Strides are in elements;
   inputs arrive contiguous, outputs are allocated contiguous by the framework. */
typedef struct specgen_tensor {{
  void* data;
  int64_t sizes[SPECGEN_MAX_DIMS];
  int64_t strides[SPECGEN_MAX_DIMS];
  int32_t ndim;
  int32_t dtype; /* specgen_dtype */
}} specgen_tensor;
#endif
"""

_ROLE_TITLES = {
    "input": "inputs: read only, never written",
    "scalar": "scalars",
    "dim": "symbolic dimensions, resolved from the inputs' shapes",
    "output": "outputs: every element must be written",
    "saved": "saved intermediates: written like outputs, every element; the backward reads them",
    "fwd_output": "the forward outputs (for the backward pass), read only",
    "saved_input": "the forward's saved intermediates (as the spec defines them), read only",
    "grad_output": "gradients of the floating outputs, read only",
    "grad_input": "gradients of the floating inputs: written by the kernel, every element",
    "workspace": "scratch for this call only (the size function's bytes or more; NULL, 0 without one); "
                 "any contents on entry",
}


def _field_comment(field: AbiField, spec) -> str:
    if field.is_tensor:
        dtype = field.tensor.dtype or f"working dtype: {' | '.join(spec.dtypes)}"
        return f"{field.tensor}  ({dtype})"
    if field.role == "dim":
        lo, hi = spec.dims.get(field.name, (None, None))
        return f"in [{lo}, {hi}]" if lo is not None else ""
    if field.role == "workspace":
        return "device memory, 256-byte aligned" if field.name == "workspace" else ""
    text = f"{field.scalar.type.kind}"
    if field.scalar.has_default:
        text += f", default {field.scalar.default!r}"
    return text


def _struct(spec, direction: str) -> str:
    lines = [f"typedef struct {struct_name(spec, direction)} {{"]
    role = None
    for field in fields(spec, direction):
        if field.role != role:
            role = field.role
            lines.append(f"  /* {_ROLE_TITLES[role]} */")
        decl = f"  {field.c_type()} {field.name};"
        comment = _field_comment(field, spec)
        lines.append(f"{decl:<36} /* {comment} */" if comment else decl)
    lines.append(f"}} {struct_name(spec, direction)};")
    return "\n".join(lines)


def header_text(spec) -> str:
    """The `<op>_abi.h` header: deterministic for a given spec and specgen version."""
    guard = f"SPECGEN_{spec.name.upper()}_ABI_H"
    directions = ["forward"] + (["backward"] if has_backward_kernel(spec) else [])
    parts = [
        f"/* {header_filename(spec)}: the kernel ABI of `{spec.name}`, generated by specgen "
        f"{__version__} (ABI version {ABI_VERSION}).\n"
        f"   Do not edit: `specgen header` writes it from the signature\n"
        f"     {spec.signature}\n"
        + "".join(f"   The package folds the leading dims *{b} into one axis {b} before the kernel.\n"
                  for b in spec.signature.batch_symbols()) +
        f"   A kernel file includes only CUDA headers and this header, and defines the entry\n"
        f"   point(s) below. All work goes on `stream`; return cudaGetLastError() or another\n"
        f"   cudaError_t. Working dtypes: {', '.join(spec.dtypes)} (dispatch on .dtype).\n"
        f"   Scratch memory: define the optional `<entry>_workspace` function to say how many bytes\n"
        f"   a call needs; the framework passes them in `workspace` (no cudaMalloc in a call). */",
        f"#ifndef {guard}\n#define {guard}\n",
        "#include <stdint.h>\n#include <stdbool.h>\n#include <cuda_runtime.h>\n",
        _COMMON,
    ]
    for direction in directions:
        parts.append(_struct(spec, direction) + "\n")
    parts.append('#ifdef __cplusplus\nextern "C" {\n#endif')
    for direction in directions:
        parts.append(f"cudaError_t {entry_point(spec, direction)}(const {struct_name(spec, direction)}* a, "
                     f"cudaStream_t stream);")
    parts.append("/* optional: the workspace bytes a call with these arguments needs (absent: none) */")
    for direction in directions:
        parts.append(f"size_t {workspace_function(spec, direction)}(const {struct_name(spec, direction)}* a);")
    parts.append("#ifdef __cplusplus\n}\n#endif\n")
    parts.append(f"#endif /* {guard} */\n")
    return "\n".join(parts)


def write_header(spec, folder: str | Path) -> Path:
    from .fsutil import write_atomic

    return write_atomic(Path(folder) / header_filename(spec), header_text(spec))


# ------------------------------------------------------------------------ ctypes

_struct_cache: dict[tuple[str, str, str], type] = {}


def ctypes_struct(spec, direction: str = "forward") -> type:
    """A ctypes.Structure class laid out exactly as the C struct of that direction."""
    key = (spec.name, direction, str(spec.signature), tuple(str(v) for v in getattr(spec, "saved_values", ())))
    if key not in _struct_cache:
        _struct_cache[key] = type(struct_name(spec, direction), (ctypes.Structure,),
                                  {"_fields_": [(f.name, f.ctype()) for f in fields(spec, direction)]})
    return _struct_cache[key]


def canonical_strides(sizes) -> list[int]:
    """The strides the ABI hands a kernel: a contiguous tensor's, from its sizes alone. torch calls
    a tensor contiguous whatever the stride of a size-1 dim (`hidden[:, -1, :]` of a [1, T, D]
    batch keeps stride T * D there); a kernel that sized a row by sizes[0] * strides[0] would
    read T rows (held-out attacks-v7, session 30)."""
    strides, step = [0] * len(sizes), 1
    for axis in reversed(range(len(sizes))):
        strides[axis] = step
        step *= max(int(sizes[axis]), 1)
    return strides


def tensor_arg(tensor) -> SpecgenTensor:
    """A specgen_tensor describing a torch tensor (no copy: the tensor must stay alive)."""
    from .inputs import DTYPE_NAMES

    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"tensors of more than {MAX_DIMS} dims are not supported by ABI {ABI_VERSION}")
    arg = SpecgenTensor()
    arg.data = tensor.data_ptr() or None
    for axis, stride in enumerate(canonical_strides(tensor.shape)):
        arg.sizes[axis] = tensor.size(axis)
        arg.strides[axis] = stride
    arg.ndim = tensor.dim()
    arg.dtype = DTYPE_CODES[DTYPE_NAMES[tensor.dtype]]
    return arg


def pack_args(spec, direction: str, tensors: dict, scalars: dict, dims: dict):
    """Fill the struct of `direction` from tensors by field name, scalar values and dims."""
    struct = ctypes_struct(spec, direction)()
    for field in fields(spec, direction):
        if field.role == "workspace":
            continue  # set_workspace
        if field.is_tensor:
            if field.name not in tensors:
                raise KeyError(f"no tensor given for ABI field {field.name!r}")
            setattr(struct, field.name, tensor_arg(tensors[field.name]))
        elif field.role == "dim":
            setattr(struct, field.name, int(dims[field.name]))
        else:
            value = scalars[field.name] if field.name in scalars else field.scalar.default
            setattr(struct, field.name, value)
    return struct


def set_workspace(struct, workspace) -> None:
    """Hand the kernel `workspace` (a uint8 device tensor, or None: no workspace)."""
    if workspace is None or workspace.numel() == 0:
        struct.workspace, struct.workspace_bytes = None, 0
    else:
        struct.workspace, struct.workspace_bytes = workspace.data_ptr(), workspace.numel()
