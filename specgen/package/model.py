"""The package as data: what the templates in templates/package/ are rendered from.

`package_model(specs, kernels, ...)` turns validated specs and their kernel sources into
plain objects (ops, tensor args, scalars, shapes as C++ and Python expressions), so the
templates hold no logic beyond loops and the rules live here, where they can be tested.
"""
from __future__ import annotations

import hashlib
import json
import keyword
import re
from dataclasses import dataclass, field

from .. import abi
from ..reference_import import reference_code
from ..errors import UsageError
from ..signature import Dim, Param, TensorType, format_scalar
from .torch_build import installed_torch_build

# The oldest torch a package without compiled code supports (its Python uses torch.library
# as of 2.10). A package with kernels requires the torch minor version it was built against
# (PackageModel.torch_version): its binding uses the full torch C++ API, whose ABI changes
# between minor versions (docs/ARCHITECTURE.md, "The package").
TORCH_TARGET_VERSION = (2, 10)
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"  # Ampere, Hopper, and PTX so newer GPUs JIT the Hopper code
# torch::headeronly::ScalarType names of the dtype names the signature language knows
SCALAR_TYPES = {"float32": "Float", "float16": "Half", "bfloat16": "BFloat16", "float64": "Double",
                "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
                "bool": "Bool"}
CPP_SCALARS = {"float": "double", "int": "int64_t", "bool": "bool"}
SCHEMA_SCALARS = {"float": "float", "int": "int", "bool": "bool"}
PY_SCALARS = {"float": "float", "int": "int", "bool": "bool"}
PACKAGE_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")


@dataclass(frozen=True)
class DimModel:
    """One axis of a tensor: how it relates to its symbol, in C++ and Python spelling."""

    text: str  # as in the signature: "2*H"
    symbol: str | None
    mul: int
    div: int
    add: int

    @property
    def literal(self) -> int | None:
        return self.add if self.symbol is None else None

    def size_expr(self, dims: str = "") -> str:
        """The size this axis must have, from resolved symbols (`dims` prefixes them)."""
        return Dim(self.symbol, self.mul, self.div, self.add).c_expr(dims)

    def py_size_expr(self, dims: str = "") -> str:
        return self.size_expr(dims).replace(" / ", " // ")


@dataclass(frozen=True)
class SymbolBinding:
    """Where a symbol's value comes from: `size` of input `arg`, axis `axis`."""

    symbol: str
    arg: str
    axis: int
    dim: DimModel

    def cpp_expr(self, size: str) -> str:
        """The symbol's value from the size (C++); divisibility is checked separately."""
        d = self.dim
        text = size if not d.add else f"({size} - ({d.add}))"
        if d.div != 1:
            text = f"{text} * {d.div}"
        if d.mul != 1:
            text = f"({text}) / {d.mul}"
        return text


@dataclass(frozen=True)
class TensorArgModel:
    name: str
    dims: tuple[DimModel, ...]
    dtype: str | None  # None: the working dtype
    value_range: tuple[DimModel, DimModel] | None  # integer tensors: [lo, hi)
    signature_type: str  # "Tensor[N, D]"
    differentiable: bool = False  # an input the backward gives a gradient (floating, not in `no_grad:`)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def is_floating(self) -> bool:
        return self.dtype is None or self.dtype in ("float32", "float16", "bfloat16", "float64")

    @property
    def scalar_type(self) -> str | None:
        return SCALAR_TYPES[self.dtype] if self.dtype else None

    @property
    def shape_text(self) -> str:
        return "[" + ", ".join(d.text for d in self.dims) + "]"


@dataclass(frozen=True)
class ScalarArgModel:
    name: str
    kind: str  # float | int | bool
    default: str | None  # Python literal, None when the argument is required

    @property
    def cpp_type(self) -> str:
        return CPP_SCALARS[self.kind]

    @property
    def schema(self) -> str:
        text = f"{SCHEMA_SCALARS[self.kind]} {self.name}"
        return text if self.default is None else f"{text}={self.default}"

    @property
    def py_param(self) -> str:
        text = f"{self.name}: {PY_SCALARS[self.kind]}"
        return text if self.default is None else f"{text} = {self.default}"


# The binding's local variable of each ABI struct field: a role prefix keeps them apart from
# each other and from the binding's other names (a symbol may be called `device`).
KERNEL_PARAM_PREFIXES = {"input": "in_", "scalar": "sc_", "dim": "dim_", "output": "out_", "saved": "sv_",
                         "fwd_output": "fwd_", "saved_input": "svin_", "grad_output": "gout_", "grad_input": "gin_"}


@dataclass(frozen=True)
class KernelParam:
    """One field of the kernel's ABI struct, in ABI order, and the binding's local that fills it."""

    field: str
    role: str  # abi.AbiField roles
    ndim: int | None  # tensors only
    cpp_type: str  # scalars and dims: the C++ type; tensors: "const at::Tensor&"
    schema_type: str  # "Tensor", "float", "int", "bool"

    @property
    def name(self) -> str:
        return KERNEL_PARAM_PREFIXES[self.role] + self.field

    @property
    def is_tensor(self) -> bool:
        return self.ndim is not None

    @property
    def written(self) -> bool:
        return self.role in ("output", "saved", "grad_input")


@dataclass(frozen=True)
class OpModel:
    name: str
    description: str
    signature: str
    dtypes: tuple[str, ...]
    dim_ranges: dict[str, tuple[int, int]]
    tolerances: dict[str, tuple[float, float]]
    params: tuple  # TensorArgModel | ScalarArgModel, in signature order
    symbols: tuple[str, ...]  # in ABI order
    bindings: tuple[SymbolBinding, ...]
    outputs: tuple[TensorArgModel, ...]
    backward: str  # kernel | reference | none
    kernel_source: str | None  # None: no verified kernel, CUDA runs the reference
    header_text: str
    reference_source: str
    provenance: dict = field(default_factory=dict)  # agent, model, verification, benchmark
    kernel_params_by_direction: dict = field(default_factory=dict)  # "forward"/"backward" -> KernelParam tuple
    replaces: tuple = ()  # specgen.replaces.Replaces: the layers that stand in for model modules
    # saved intermediates (docs/ARCHITECTURE.md "Saved intermediates"): hidden outputs of
    # `<op>_fwd_saved`, named by their ABI field (saved_<name>), and each one's definition
    saved: tuple[TensorArgModel, ...] = ()
    saved_definitions: tuple[tuple[str, str], ...] = ()  # (field, Python expression over the params)
    # `Tensor[*B, D]` (docs/ARCHITECTURE.md "Leading batch dims"): the batch group's symbol. The
    # op's registrations then sit on `<op>_rows` (the op on [B, D]), and `<op>` is a composite
    # that folds the leading dims into B, calls it and restores them; None: no batch group.
    batch: str | None = None

    @property
    def result_class(self) -> str | None:
        """The named tuple a multi-output op returns (None: one tensor)."""
        if len(self.outputs) == 1:
            return None
        return "".join(part.capitalize() for part in self.name.split("_")) + "Result"

    @property
    def layers(self) -> list[dict]:
        """One entry per layer class: its forward and how it calls the op (templates/package layers.py.j2)."""
        out = []
        for r in self.replaces:
            call = []
            for p in self.params:
                if p.name in r.args:
                    call.append(f"{p.name}={r.args[p.name]}")
            returned = r.returned
            names = [o.name for o in self.outputs]
            out.append({"name": r.layer, "modules": list(r.modules), "forward": r.forward_params,
                        "call": ", ".join(call), "args": dict(r.args),
                        "attributes": [v for v in r.args.values() if v.startswith("self.")],
                        "returns": None if returned is None else [names.index(n) for n in returned],
                        "single": r.single_return() or (returned is None and len(self.outputs) == 1)})
        return out

    def kernel_params(self, direction: str = "forward") -> tuple[KernelParam, ...]:
        return self.kernel_params_by_direction[direction]

    def workspace_function(self, direction: str) -> str | None:
        """The kernel's size function of `direction` where its source defines one (the binding
        then allocates the workspace it asks for; the gate refuses a kernel that defines it under
        another spelling), else None."""
        if self.kernel_source is None or not abi.names_workspace_function(self, self.kernel_source, direction):
            return None
        return abi.workspace_function(self, direction)

    @property
    def verified_on(self) -> str | None:
        return (self.provenance or {}).get("verified_on")

    @property
    def inputs(self) -> tuple[TensorArgModel, ...]:
        return tuple(p for p in self.params if isinstance(p, TensorArgModel))

    @property
    def scalars(self) -> tuple[ScalarArgModel, ...]:
        return tuple(p for p in self.params if isinstance(p, ScalarArgModel))

    @property
    def grad_inputs(self) -> tuple[TensorArgModel, ...]:
        """The inputs the backward returns a gradient for (floating, not in the spec's `no_grad:`)."""
        return tuple(t for t in self.inputs if t.differentiable)

    @property
    def no_grad_inputs(self) -> tuple[TensorArgModel, ...]:
        """Floating inputs the spec gives no gradient: a call where one requires grad is refused."""
        return tuple(t for t in self.inputs if t.is_floating and not t.differentiable)

    @property
    def floating_outputs(self) -> tuple[TensorArgModel, ...]:
        return tuple(t for t in self.outputs if t.is_floating)

    @property
    def working_inputs(self) -> tuple[TensorArgModel, ...]:
        """Inputs that take the working dtype: the first one sets it for the call."""
        return tuple(t for t in self.inputs if t.dtype is None)

    @property
    def has_kernel(self) -> bool:
        return self.kernel_source is not None

    @property
    def has_backward_kernel(self) -> bool:
        return self.has_kernel and self.backward == "kernel"

    @property
    def has_backward(self) -> bool:
        return self.backward != "none" and bool(self.grad_inputs) and bool(self.floating_outputs)

    @property
    def schema(self) -> str:
        args = ", ".join(f"Tensor {p.name}" if isinstance(p, TensorArgModel) else p.schema
                         for p in self.params)
        return f"({args}) -> {_schema_returns(len(self.outputs))}"

    @property
    def rows_name(self) -> str:
        """The op that the kernel, the reference, the fake kernel and the autograd are registered
        on: `<op>_rows` under a batch group's composite `<op>`, else `<op>` itself. Its companions
        keep the public name: `<op>_fwd_saved`, `<op>_backward`."""
        return f"{self.name}_rows" if self.batch else self.name

    def is_batched(self, t: TensorArgModel) -> bool:
        """Whether `t` starts with the batch group (the starred symbol is only ever a first dim)."""
        return self.batch is not None and bool(t.dims) and t.dims[0].symbol == self.batch

    @property
    def batched_inputs(self) -> tuple[TensorArgModel, ...]:
        return tuple(t for t in self.inputs if self.is_batched(t))

    @property
    def backward_name(self) -> str:
        return f"{self.name}_backward"

    @property
    def fwd_saved_name(self) -> str:
        """The internal op that returns the outputs and the saved values (autograd calls it)."""
        return f"{self.name}_fwd_saved"

    @property
    def fwd_saved_schema(self) -> str:
        args = ", ".join(f"Tensor {p.name}" if isinstance(p, TensorArgModel) else p.schema
                         for p in self.params)
        return f"({args}) -> {_schema_returns(len(self.outputs) + len(self.saved))}"

    @property
    def backward_schema(self) -> str:
        """inputs, scalars (no defaults), forward outputs, output grads -> input grads."""
        args = [f"Tensor {t.name}" for t in self.inputs]
        args += [f"{SCHEMA_SCALARS[s.kind]} {s.name}" for s in self.scalars]
        args += [f"Tensor {o.name}" for o in self.outputs]
        args += [f"Tensor {v.name}" for v in self.saved]  # none: the schema is as before saved values
        args += [f"Tensor grad_{o.name}" for o in self.floating_outputs]
        return f"({', '.join(args)}) -> {_schema_returns(len(self.grad_inputs))}"

    # The C++ binding (torch_binding.cpp.j2): parameters as the schemas order them, prefixed
    # `a_` so that no argument name collides with a C++ keyword or a local of the binding.
    def _cpp_forward(self) -> list[tuple[str, str]]:
        return [("const at::Tensor&" if isinstance(p, TensorArgModel) else p.cpp_type, f"a_{p.name}")
                for p in self.params]

    def _cpp_backward(self) -> list[tuple[str, str]]:
        out = [("const at::Tensor&", f"a_{t.name}") for t in self.inputs]
        out += [(s.cpp_type, f"a_{s.name}") for s in self.scalars]
        out += [("const at::Tensor&", f"a_{o.name}") for o in self.outputs]
        out += [("const at::Tensor&", f"a_{v.name}") for v in self.saved]
        out += [("const at::Tensor&", f"a_grad_{o.name}") for o in self.floating_outputs]
        return out

    @property
    def cpp_forward_params(self) -> str:
        return ", ".join(f"{t} {n}" for t, n in self._cpp_forward())

    @property
    def cpp_forward_types(self) -> str:
        return ", ".join(t for t, _ in self._cpp_forward())

    @property
    def cpp_forward_args(self) -> str:
        return ", ".join(n for _, n in self._cpp_forward())

    @property
    def cpp_backward_params(self) -> str:
        return ", ".join(f"{t} {n}" for t, n in self._cpp_backward())

    @property
    def cpp_backward_types(self) -> str:
        return ", ".join(t for t, _ in self._cpp_backward())

    @property
    def cpp_backward_args(self) -> str:
        return ", ".join(n for _, n in self._cpp_backward())

    def cpp_grad_slots(self, found: str) -> str:
        """What a C++ autograd backward returns, one entry per forward argument: `found[k]`
        (the backward op's k-th result) for an input with a gradient, an undefined tensor otherwise."""
        slots, k = [], 0
        for p in self.params:
            if isinstance(p, TensorArgModel) and p.differentiable:
                slots.append(f"{found}[{k}]")
                k += 1
            else:
                slots.append("at::Tensor()")
        return ", ".join(slots)

    def input_index(self, name: str) -> int:
        return [t.name for t in self.inputs].index(name)

    @property
    def ranged_inputs(self) -> tuple[TensorArgModel, ...]:
        """Integer inputs with a declared value range (`target: Tensor[N] int64 in [0, C)`): the
        CPU path checks their values (_ops.check_values); with a kernel, the binding launches the
        device check (torch-ext/range_check.cu) on each before the forward kernel."""
        return tuple(t for t in self.inputs if t.value_range is not None and not t.is_floating)

    def output_index(self, name: str) -> int:
        return [o.name for o in self.outputs].index(name)

    def saved_index(self, name: str) -> int:
        return [v.name for v in self.saved].index(name)

    @property
    def py_params(self) -> str:
        return ", ".join(f"{p.name}: torch.Tensor" if isinstance(p, TensorArgModel) else p.py_param
                         for p in self.params)

    @property
    def py_return(self) -> str:
        if len(self.outputs) == 1:
            return "torch.Tensor"
        return self.result_class

    @property
    def call_args(self) -> str:
        return ", ".join(p.name for p in self.params)

    def data(self) -> dict:
        """Plain data for the package's Python side (_spec_data.py): fake shapes, tests."""
        def dims(t):
            return [(d.symbol, d.mul, d.div, d.add) for d in t.dims]

        def tensor(t):
            entry = {"name": t.name, "dims": dims(t), "dtype": t.dtype, "floating": t.is_floating,
                     "grad": t.differentiable}
            if t.value_range:
                entry["range"] = [(d.symbol, d.mul, d.div, d.add) for d in t.value_range]
            return entry

        return {
            "name": self.name, "signature": self.signature, "description": self.description,
            "schema": self.schema, "backward_schema": self.backward_schema if self.has_backward else None,
            "dtypes": list(self.dtypes), "dims": {k: list(v) for k, v in self.dim_ranges.items()},
            "tolerance": {k: list(v) for k, v in self.tolerances.items()},
            "params": [("tensor" if isinstance(p, TensorArgModel) else "scalar", p.name) for p in self.params],
            "inputs": [tensor(t) for t in self.inputs],
            "scalars": [{"name": s.name, "kind": s.kind,
                         "default": None if s.default is None else _literal(s.default)} for s in self.scalars],
            "outputs": [tensor(t) for t in self.outputs],
            "bindings": [(b.symbol, b.arg, b.axis, b.dim.mul, b.dim.div, b.dim.add) for b in self.bindings],
            "backward": self.backward, "has_backward": self.has_backward,
            "has_kernel": self.has_kernel, "has_backward_kernel": self.has_backward_kernel and self.has_backward,
            "symbols": list(self.symbols),
            "verified_on": self.verified_on if self.has_kernel else None,
            "note": (self.provenance or {}).get("note"),
            # only for an op with saved values: every other op's data is as before they existed
            **({"saved": [tensor(t) for t in self.saved], "fwd_saved_schema": self.fwd_saved_schema}
               if self.saved else {}),
            # only for an op with a batch group, likewise
            **({"batch": self.batch, "rows": self.rows_name} if self.batch else {}),
        }


@dataclass(frozen=True)
class PackageModel:
    name: str  # Python package and torch.ops namespace
    version: str
    ops: tuple[OpModel, ...]
    arch_list: str
    torch_target: tuple[int, int] = TORCH_TARGET_VERSION
    specgen_version: str = ""
    namespace: str = ""  # the torch.ops namespace: <name>_<content hash>, so two builds never collide
    cuda_runtime_requirement: str | None = None  # the CUDA runtime wheel the extension links
    torch_version: tuple[int, int] = TORCH_TARGET_VERSION  # the torch the binding compiles against
    torch_cxx11_abi: bool = True  # that torch's _GLIBCXX_USE_CXX11_ABI

    @property
    def hub_name(self) -> str:
        """The HF `kernels` name (^[a-z][-a-z0-9]*[a-z0-9]$: dashes, where Python has underscores)."""
        return self.name.strip("_").replace("_", "-")

    @property
    def layers(self) -> list[tuple[OpModel, dict]]:
        return [(op, layer) for op in self.ops for layer in op.layers]

    @property
    def requirements(self) -> list[str]:
        reqs = [self.torch_requirement]
        if self.has_kernels and self.cuda_runtime_requirement:
            reqs.append(self.cuda_runtime_requirement)
        return reqs

    @property
    def archs(self) -> list[tuple[str, bool]]:
        """[(\"90\", with_ptx)] from \"8.0;9.0+PTX\"."""
        return parse_arch_list(self.arch_list)

    @property
    def arch_table(self) -> list[tuple[int, int, str, bool]]:
        """[(major, minor, suffix, with_ptx)] for the Python-side architecture check."""
        table = []
        for num, ptx in self.archs:
            match = re.fullmatch(r"(\d+)(\d)([a-z]?)", num)
            table.append((int(match.group(1)), int(match.group(2)), match.group(3), ptx))
        return table

    @property
    def unverified_ops(self) -> list[str]:
        return [op.name for op in self.ops if op.has_kernel and not op.verified_on]

    @property
    def reference_ops(self) -> list[str]:
        return [op.name for op in self.ops if not op.has_kernel]

    @property
    def cuda_capabilities(self) -> list[str]:
        return [f"{major}.{minor}{suffix}" for major, minor, suffix, _ in self.arch_table]

    @property
    def torch_requirement(self) -> str:
        """A package with kernels: the build's torch minor version (the binding is compiled
        against its C++ ABI); without: the oldest torch its Python supports."""
        if self.has_kernels:
            major, minor = self.torch_version
            return f"torch>={major}.{minor},<{major}.{minor + 1}"
        return f"torch>={self.torch_target[0]}.{self.torch_target[1]}"

    @property
    def has_kernels(self) -> bool:
        return any(op.has_kernel for op in self.ops)

    @property
    def has_batched_kernels(self) -> bool:
        """Whether the binding registers a batch group's composite (ops with a kernel only)."""
        return any(op.batch and op.has_kernel for op in self.ops)

    @property
    def range_sites(self) -> list[tuple[OpModel, TensorArgModel]]:
        """(op, input) for every integer input with a value range of an op with a kernel, in
        order: a violation found on the device is recorded by its index here (the binding's
        kRangeSites). Empty: the package has no device range check (no range_check.cu)."""
        return [(op, t) for op in self.ops if op.has_kernel for t in op.ranged_inputs]

    def range_site(self, op: OpModel, name: str) -> int:
        return [(o.name, t.name) for o, t in self.range_sites].index((op.name, name))


def _literal(text: str):
    if text in ("True", "False"):
        return text == "True"
    if text in ("inf", "-inf", "nan"):
        return float(text)
    return float(text) if any(c in text for c in ".eE") else int(text)


def _schema_returns(count: int) -> str:
    if count == 1:
        return "Tensor"
    return "(" + ", ".join("Tensor" for _ in range(count)) + ")"


def parse_arch_list(text: str) -> list[tuple[str, bool]]:
    """`"8.0;9.0+PTX"` -> [("80", False), ("90", True)]; raises UsageError when malformed."""
    archs = []
    for item in re.split(r"[;,\s]+", text.strip()):
        if not item:
            continue
        match = re.fullmatch(r"(\d+)\.(\d+)([a-z]?)(\+PTX)?", item)
        if not match:
            raise UsageError(f"--arch-list: {item!r} is not a CUDA capability; "
                             f"write e.g. \"8.0;9.0+PTX\" (major.minor, +PTX to embed PTX)")
        archs.append((match.group(1) + match.group(2) + match.group(3), bool(match.group(4))))
    if not archs:
        raise UsageError("--arch-list is empty; write e.g. \"8.0;9.0+PTX\"")
    return archs


def verified_archs(verified_on) -> set[str]:
    """The architectures ("90", "90a") the verification records name ("sm_90 (NVIDIA H200)")."""
    found = set()
    for text in verified_on:
        match = re.match(r"sm_(\d+[a-z]?)\b", text or "")
        if match:
            found.add(match[1])
    return found


def check_archs_verified(arch_list: str, verified_on, allowed: bool) -> None:
    """Refuse an --arch-list entry no packaged kernel was verified on: its code for that
    architecture (a `__CUDA_ARCH__ < 900` path, say) never ran in the verifier (held-out attacks-v7,
    session 30: a swiglu whose pre-Hopper path drops the last N % 4 rows passed the H200). PTX of a
    verified architecture is what newer GPUs run, so newer GPUs need no entry of their own."""
    verified_on = [v for v in verified_on if v]
    found = verified_archs(verified_on)
    if allowed or not verified_on:
        return
    unverified = [f"{num[:-1]}.{num[-1]}" for num, _ in parse_arch_list(arch_list)
                  if num not in found and num.rstrip("abcdefghijklmnopqrstuvwxyz") not in found]
    if unverified:
        have = ", ".join(sorted(f"sm_{a}" for a in found)) or "none"
        raise UsageError(f"--arch-list: {', '.join(unverified)} is not an architecture the kernels were verified on "
                         f"({have}): their code for it never ran in the verifier. Verify on such a GPU "
                         f"(`specgen verify --locked --record` there), drop it (the newest verified architecture's "
                         f"PTX serves newer GPUs), or pass --allow-unverified-archs to build it anyway")


def default_arch_list(verified_on) -> str:
    """The CUDA targets of a wheel when --arch-list is not given: every architecture a packaged
    kernel was verified on ("sm_90 (NVIDIA H200)" -> 9.0), the newest also as PTX so newer
    GPUs JIT it; DEFAULT_ARCH_LIST when no kernel has a verification record."""
    found = set()
    for text in verified_on:
        match = re.match(r"sm_(\d+)(\d)([a-z]?)\b", text or "")
        if match:
            found.add((int(match[1]), int(match[2]), match[3]))
    if not found:
        return DEFAULT_ARCH_LIST
    archs = [f"{major}.{minor}{suffix}" for major, minor, suffix in sorted(found)]
    archs[-1] += "+PTX"
    return ";".join(archs)


def _dim_model(dim: Dim) -> DimModel:
    return DimModel(str(dim), dim.symbol, dim.mul, dim.div, dim.add)


def _tensor_model(name: str, t: TensorType) -> TensorArgModel:
    value_range = (_dim_model(t.value_range[0]), _dim_model(t.value_range[1])) if t.value_range else None
    return TensorArgModel(name, tuple(_dim_model(d) for d in t.dims), t.dtype, value_range, str(t),
                          differentiable=t.differentiable)


def _param_model(p: Param):
    if p.is_tensor:
        return _tensor_model(p.name, p.type)
    default = format_scalar(p.default) if p.has_default else None
    return ScalarArgModel(p.name, p.type.kind, default)


def _bindings(spec, inputs: tuple[TensorArgModel, ...]) -> tuple[SymbolBinding, ...]:
    """Bind each symbol at its first plain appearance in an input shape (else its first use)."""
    found: dict[str, SymbolBinding] = {}
    for plain_only in (True, False):
        for t in inputs:
            for axis, d in enumerate(t.dims):
                if d.symbol and d.symbol not in found and (not plain_only or (d.mul, d.div, d.add) == (1, 1, 0)):
                    found[d.symbol] = SymbolBinding(d.symbol, t.name, axis, d)
    missing = [s for s in spec.signature.symbols() if s not in found]
    if missing:
        raise UsageError(f"{spec.path or spec.name}: signature: the symbol(s) {', '.join(missing)} appear in no "
                         f"input shape, so the package cannot resolve them from the arguments; "
                         f"use them in an input's shape")
    return tuple(found[s] for s in spec.signature.symbols())


def _kernel_params(spec, direction: str) -> tuple[KernelParam, ...]:
    params = []
    for f in abi.fields(spec, direction):
        if f.role == "workspace":
            continue  # allocated by the binding for the kernel's size function, not an argument
        if f.is_tensor:
            params.append(KernelParam(f.name, f.role, len(f.tensor.dims), "const at::Tensor&", "Tensor"))
        elif f.role == "dim":
            params.append(KernelParam(f.name, f.role, None, "int64_t", "int"))
        else:
            kind = f.scalar.type.kind
            params.append(KernelParam(f.name, f.role, None, CPP_SCALARS[kind], SCHEMA_SCALARS[kind]))
    return tuple(params)


def op_model(spec, kernel_source: str | None, provenance: dict | None = None) -> OpModel:
    sig = spec.signature
    params = tuple(_param_model(p) for p in sig.params)
    inputs = tuple(p for p in params if isinstance(p, TensorArgModel))
    for t in inputs + tuple(_tensor_model(o.name, o.type) for o in sig.outputs):
        if t.ndim > abi.MAX_DIMS:
            raise UsageError(f"{spec.path or spec.name}: signature: {t.name} has {t.ndim} dims; the kernel ABI "
                             f"allows at most {abi.MAX_DIMS}")
    if not inputs:
        raise UsageError(f"{spec.path or spec.name}: signature: the op takes no tensor; the package needs at "
                         f"least one tensor input to place its outputs on a device")
    batch = sig.batch_symbols()
    if len(batch) > 1:  # one lead shape per call keeps the composite's rule simple
        raise UsageError(f"{spec.path or spec.name}: signature: {len(batch)} batch groups "
                         f"({', '.join('*' + b for b in batch)}); a package op takes at most one")
    return OpModel(
        name=spec.name,
        description=" ".join(spec.description.split()),
        signature=str(sig),
        dtypes=tuple(spec.dtypes),
        dim_ranges={k: tuple(v) for k, v in spec.dims.items()},
        tolerances={d: (spec.tolerance_for(d).atol, spec.tolerance_for(d).rtol) for d in spec.dtypes},
        params=params,
        symbols=tuple(sig.symbols()),
        bindings=_bindings(spec, inputs),
        outputs=tuple(_tensor_model(o.name, o.type) for o in sig.outputs),
        backward=spec.backward,
        kernel_source=kernel_source,
        header_text=abi.header_text(spec),
        reference_source=reference_code(spec, resolve=False),  # an import path: its adapter
        saved=tuple(_tensor_model(v.field, v.type) for v in spec.saved_values),
        saved_definitions=tuple((v.field, v.expression) for v in spec.saved_values),
        provenance=dict(provenance or {}),
        kernel_params_by_direction={d: _kernel_params(spec, d) for d in abi.DIRECTIONS
                                    if d == "forward" or spec.backward == "kernel"},
        replaces=tuple(getattr(spec, "replaces", None) or ()),
        batch=batch[0] if batch else None,
    )


def cuda_runtime_requirement(cuda_version: str | None = None) -> str | None:
    """The pip requirement of the CUDA runtime wheel matching torch's CUDA build: the extension
    links libcudart.so.<major>, which torch's own CUDA wheels provide as nvidia-cuda-runtime
    (CUDA 13) or nvidia-cuda-runtime-cu<major> (CUDA 12 and older). None for a CPU torch."""
    if cuda_version is None:
        build = installed_torch_build()
        cuda_version = build.cuda if build else None
    if not cuda_version:
        return None
    major = int(str(cuda_version).split(".")[0])
    name = "nvidia-cuda-runtime" if major >= 13 else f"nvidia-cuda-runtime-cu{major}"
    return f'{name}>={major},<{major + 1}; platform_system == "Linux"'


def installed_torch() -> tuple[tuple[int, int], bool] | None:
    """((major, minor), cxx11 ABI) of the torch installed here (the one a wheel build compiles
    against), or None without torch."""
    build = installed_torch_build()
    if build is None:
        return None
    match = re.match(r"(\d+)\.(\d+)", build.version)
    return (int(match[1]), int(match[2])), build.cxx11_abi


def build_namespace(name: str, version: str, ops, specgen_version: str) -> str:
    """<name>_<10 hex>: a hash of everything the build registers and compiles, so two different
    builds (another spec, kernel or version) loaded in one process never share torch.ops names,
    and the same specs give the same namespace (reproducible wheels)."""
    blob = json.dumps({"name": name, "version": version, "specgen": specgen_version,
                       "ops": [[op.data(), op.kernel_source, op.reference_source] for op in ops]},
                      sort_keys=True, default=str)
    return f"{name}_{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def check_package_name(name: str, *, installed: bool = False) -> str:
    """A lowercase identifier that is no keyword, torch namespace or well-known module; with
    `installed`, also nothing importable or installed here that the wheel would shadow."""
    from ..names import package_name_problem

    if not PACKAGE_NAME.fullmatch(name) or keyword.iskeyword(name):
        raise UsageError(f"--name {name!r}: the package name is also the Python module and the torch.ops "
                         f"namespace, so it must be a lowercase identifier such as my_kernels")
    problem = package_name_problem(name) if installed else _static_name_problem(name)
    if problem:
        raise UsageError(f"--name {name!r}: {problem}; choose another name, e.g. {name}_kernels")
    return name


def _static_name_problem(name: str) -> str | None:
    from ..names import package_name_problem

    problem = package_name_problem(name)
    return problem if problem and "already" not in problem else None


# PEP 440, as packaging.version.VERSION_PATTERN has it (public versions, local part allowed)
_VERSION = re.compile(r"""v?(?:(?:[0-9]+)!)?[0-9]+(?:\.[0-9]+)*(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?
                          (?:(?:-[0-9]+)|(?:[-_.]?(?:post|rev|r)[-_.]?[0-9]*))?(?:[-_.]?dev[-_.]?[0-9]*)?
                          (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?""", re.VERBOSE | re.IGNORECASE)


def check_version(version: str) -> str:
    """A PEP 440 version such as 0.1.0, 1.2rc1 or 2.0.post1 (it goes into pyproject.toml)."""
    if not isinstance(version, str) or len(version) > 64 or not _VERSION.fullmatch(version):
        raise UsageError(f"--version {version!r}: not a Python package version (PEP 440); write e.g. 0.1.0")
    return version


def package_model(name: str, specs, kernels: dict[str, str | None], *, version: str = "0.1.0",
                  arch_list: str = DEFAULT_ARCH_LIST, provenance: dict[str, dict] | None = None) -> PackageModel:
    """`kernels` maps op name -> .cu source (None: the op runs its reference on CUDA too)."""
    from .. import __version__

    from ..names import name_problem, op_collisions

    check_package_name(name)
    check_version(version)
    arch_list = ";".join(item for item in re.split(r"[;,\s]+", arch_list.strip()) if item)  # no newlines in setup.py
    parse_arch_list(arch_list)
    seen: set[str] = set()
    ops = []
    for spec in specs:
        if spec.name in seen:
            raise UsageError(f"two specs define the op {spec.name!r}; op names must be unique in a package")
        seen.add(spec.name)
        if problem := name_problem(spec.name, "op"):  # load_spec checked it; a KernelSpec can be built by hand
            raise UsageError(f"{spec.path or spec.name}: name: {problem}")
        ops.append(op_model(spec, kernels.get(spec.name), (provenance or {}).get(spec.name)))
    collisions = op_collisions([op.name for op in ops], {op.name: op.has_backward for op in ops})
    collisions += [f"op {op.fwd_saved_name!r} collides with the internal op that returns the saved values of "
                   f"{op.name!r}" for op in ops if op.saved and op.fwd_saved_name in {o.name for o in ops}]
    collisions += [f"op {op.rows_name!r} collides with the internal op that runs {op.name!r} on its batch group "
                   f"folded into one axis (*{op.batch})" for op in ops
                   if op.batch and op.rows_name in {o.name for o in ops} | {o.rows_name for o in ops if o is not op}]
    if collisions:
        raise UsageError("; ".join(collisions) + "; rename one of them")
    layer_owner: dict[str, str] = {}
    for op in ops:
        for r in op.replaces:
            if r.layer in layer_owner:
                raise UsageError(f"the specs of {layer_owner[r.layer]!r} and {op.name!r} both declare "
                                 f"replaces: layer: {r.layer}; layer names must be unique in a package")
            layer_owner[r.layer] = op.name
    torch_build = installed_torch() if any(op.has_kernel for op in ops) else None
    torch_version, cxx11_abi = torch_build or (TORCH_TARGET_VERSION, True)
    return PackageModel(name=name, version=version, ops=tuple(ops), arch_list=arch_list,
                        specgen_version=__version__, torch_version=torch_version, torch_cxx11_abi=cxx11_abi,
                        namespace=build_namespace(name, version, ops, __version__),
                        cuda_runtime_requirement=cuda_runtime_requirement())
