"""From a Callee and its probed shapes to the parts of a spec (signature, dims, dtypes, ...).

Each guess a person should confirm becomes a flag: a line printed by `specgen import` and
written as a comment at the top of the spec.
"""
from __future__ import annotations

import ast
import inspect
import keyword
import re
from dataclasses import dataclass, field

import torch

from ..inputs import DTYPE_NAMES, TORCH_DTYPES
from ..reference_import import adapter_body
from ..signature import FLOAT_DTYPES, INT_DTYPES, format_scalar, parse_signature
from .probe import ImportRefused, Position, Runner, Shapes, Symbol, as_tuple, probe_shapes
from .target import Callee

NAMES_BY_NDIM = {1: ["N"], 2: ["N", "D"], 3: ["B", "S", "D"], 4: ["B", "C", "H", "W"], 5: ["B", "C", "T", "H", "W"]}
MORE_NAMES = ["M", "K", "L", "E", "F", "G", "P", "Q", "R", "U", "V", "Z"]
HALF_DTYPES = ("float32", "float16", "bfloat16")
SMALL = 8  # the size of each symbol in the dtype and autograd runs (real CPU tensors)


@dataclass
class ImportedSpec:
    """A spec written from a function or module; `text()` is the YAML for the user to review."""

    name: str
    description: str
    signature: str
    dtypes: list[str]
    dims: dict[str, tuple[int, int]]
    reference: str  # Python source, or `module:name` (an import path)
    backward: str
    benchmark: list[dict[str, int]]
    flags: list[str] = field(default_factory=list)
    source: str = ""  # what it was imported from, for the header comment

    @property
    def reference_mode(self) -> str:
        from ..reference_import import is_import_path

        return "import" if is_import_path(self.reference) else "inline"

    def text(self) -> str:
        from .render import render_yaml

        return render_yaml(self)

    def as_json(self) -> dict:
        return {"name": self.name, "description": self.description, "signature": self.signature,
                "dtypes": self.dtypes, "dims": {k: list(v) for k, v in self.dims.items()},
                "reference_mode": self.reference_mode, "backward": self.backward, "benchmark": self.benchmark,
                "flags": self.flags, "source": self.source}


# ------------------------------------------------------------------------------ names

def snake_case(text: str) -> str:
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text.split(".")[-1]).lower()
    text = re.sub(r"\W+", "_", text).strip("_") or "op"
    if text[0].isdigit() or keyword.iskeyword(text):
        text = f"op_{text}"
    return text


def op_name(callee: Callee) -> str:
    target = callee.target
    if target.is_module_class and target.name == "Model" and target.source_file is not None:
        return snake_case(target.source_file.stem)
    return snake_case(target.name)


def name_symbols(shapes: Shapes, runner: Runner, taken: set[str]) -> None:
    order: list[Symbol] = []
    first_ndim = None
    for name, tensor in runner.tensors.items():
        first_ndim = first_ndim or tensor.ndim
        for axis in range(tensor.ndim):
            symbol, _, _ = shapes.dim_of(Position(name, axis, tensor.shape[axis]))
            if symbol is not None and symbol not in order:
                order.append(symbol)
    preferred = list(NAMES_BY_NDIM.get(first_ndim or 0, [])) + MORE_NAMES
    used = set(taken)
    for symbol in order:
        for candidate in preferred + [f"S{k}" for k in range(100)]:
            if candidate not in used:
                symbol.name = candidate
                used.add(candidate)
                break


def resolve_flags(flags: list[str], symbols: list[Symbol]) -> list[str]:
    names = {str(id(s)): s.name for s in symbols}

    def swap(match: re.Match) -> str:
        return ", ".join(names.get(key, "?") for key in match.group(1).split(","))

    return [re.sub(r"\{([\d,]+)\}", swap, flag) for flag in flags]


# ------------------------------------------------------------------------------ types

def dim_text(symbol: Symbol | None, mul: int, div: int, add: int = 0, literal: int = 0) -> str:
    if symbol is None:
        return str(literal if add == 0 else add)
    text = symbol.name
    if mul != 1:
        text = f"{mul}*{text}"
    if div != 1:
        text = f"{text}/{div}"
    if add:
        text += f"+{add}" if add > 0 else f"-{-add}"
    return text


def working_dtype(runner: Runner) -> str:
    counts: dict[str, int] = {}
    for tensor in runner.tensors.values():
        if tensor.is_floating_point():
            name = DTYPE_NAMES.get(tensor.dtype)
            if name not in FLOAT_DTYPES:
                raise ImportRefused(f"dtype {tensor.dtype} is not one a spec takes ({', '.join(FLOAT_DTYPES)})")
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        raise ImportRefused("no floating tensor among the inputs: a spec's working dtype is a floating one")
    return max(counts, key=counts.get)


def small_sizes(shapes: Shapes) -> dict[Position, int]:
    sizes: dict[Position, int] = {}
    for symbol in shapes.symbols:
        value = max(symbol.lo, min(symbol.value, SMALL))
        value = -(-value // symbol.step) * symbol.step
        sizes.update(symbol.sizes(value))
    return sizes


def value_range(runner: Runner, name: str, shapes: Shapes, flags: list[str]) -> str:
    """`in [lo, hi)` of an integer input: an index into a symbol when the reference says so."""
    tensor = runner.tensors[name]
    lo_value = int(tensor.min()) if tensor.numel() else 0
    hi_value = int(tensor.max()) if tensor.numel() else 0
    lo = "0" if lo_value >= 0 else str(lo_value)
    candidates = sorted((s for s in shapes.symbols if s.value > hi_value), key=lambda s: s.value)
    for symbol in candidates:
        inside = torch.full_like(tensor, symbol.value - 1)
        outside = inside.clone()
        outside.view(-1)[0] = symbol.value
        example_shapes = {n: tuple(t.shape) for n, t in runner.tensors.items()}
        if runner.run(example_shapes, device="cpu", values={name: inside}) is not None and \
                runner.run(example_shapes, device="cpu", values={name: outside}) is None:
            return f"in [{lo}, {symbol.name})"
    flags.append(f"{name}: integer values [{lo_value}, {hi_value}] in the example; no size bounds them in the "
                 f"reference, so the range is [{lo}, {hi_value + 1}): widen it if larger values are valid")
    return f"in [{lo}, {hi_value + 1})"


def tensor_text(runner: Runner, name: str, tensor: torch.Tensor, shapes: Shapes, working: str,
                flags: list[str]) -> str:
    dims = []
    for axis, size in enumerate(tensor.shape):
        symbol, mul, div = shapes.dim_of(Position(name, axis, size))
        dims.append(dim_text(symbol, mul, div, literal=size))
    text = "Tensor[" + ", ".join(dims) + "]"
    dtype = DTYPE_NAMES.get(tensor.dtype)
    if dtype is None:
        raise ImportRefused(f"{name}: dtype {tensor.dtype} has no name in a spec")
    if tensor.is_floating_point():
        return text if dtype == working else f"{text} {dtype}"
    if dtype == "bool":
        return f"{text} bool"
    return f"{text} {dtype} {value_range(runner, name, shapes, flags)}"


def scalar_text(argument, flags: list[str]) -> str | None:
    value = argument.value
    kind = {bool: "bool", int: "int", float: "float"}.get(type(value))
    if kind is None:
        if argument.default is not inspect.Parameter.empty and value is argument.default:
            flags.append(f"{argument.name}: left at its default {value!r} (a spec's scalars are float, int or bool)")
            return None
        raise ImportRefused(f"argument {argument.name!r} is a {type(value).__name__}; a spec's arguments are "
                            f"tensors and float, int or bool scalars")
    if argument.default is inspect.Parameter.empty or argument.default != value:
        flags.append(f"{argument.name}: its default {format_scalar(value)} is the example's value")
    return f"{argument.name}: {kind} = {format_scalar(value)}"


# ------------------------------------------------------------------------------ probes in real tensors

def supported_dtypes(runner: Runner, shapes: Shapes, working: str, flags: list[str],
                     wanted: list[str] | None) -> tuple[list[str], list[str | None]]:
    """The working dtypes the reference runs in on the CPU, and each output's dtype (None: working)."""
    small = runner.shapes_with(small_sizes(shapes))
    trial = wanted or [working] + [d for d in HALF_DTYPES if d != working]
    working_args = [n for n, t in runner.tensors.items() if DTYPE_NAMES.get(t.dtype) == working]
    kept, seen = [], []
    for dtype in trial:
        outputs = runner.run(small, dtypes={n: TORCH_DTYPES[dtype] for n in working_args}, device="cpu")
        if outputs is None:
            flags.append(f"{dtype} left out: the reference fails on the CPU in {dtype} ({runner.last_error})")
            continue
        kept.append(dtype)
        seen.append([DTYPE_NAMES.get(o.dtype) for o in outputs])
    if not kept:
        raise ImportRefused(f"the reference runs in none of {', '.join(trial)} on small CPU inputs "
                            f"({runner.last_error})")
    out_dtypes: list[str | None] = []
    for index, output in enumerate(runner.example_outputs):
        names = [row[index] for row in seen]
        if all(name == dtype for name, dtype in zip(names, kept)):
            out_dtypes.append(None)
        elif len(set(names)) == 1:
            out_dtypes.append(names[0])
        else:
            raise ImportRefused(f"output {index}: its dtype follows neither the inputs nor one fixed dtype "
                                f"({dict(zip(kept, names))})")
    return kept, out_dtypes


def differentiable(runner: Runner, shapes: Shapes) -> bool:
    small = runner.shapes_with(small_sizes(shapes))
    try:
        with torch.enable_grad():
            args = {n: runner.tensor(n, shape, None, "cpu") for n, shape in small.items()}
            leaves = [t.requires_grad_() for t in args.values() if t.is_floating_point()]
            result = runner.callee.call(**args, **runner.others)
            outputs = [o for o in as_tuple(result) if isinstance(o, torch.Tensor)]
            outs = [o for o in outputs if o.is_floating_point() and o.requires_grad]
            if not leaves or not outs:
                return False
            torch.autograd.grad([o.sum() for o in outs], leaves, allow_unused=True)
        return True
    except Exception:  # not differentiable, or not in this shape: forward only
        return False


# ------------------------------------------------------------------------------ reference

def strip_main(source: str) -> str:
    """The module source without its `if __name__ == "__main__":` blocks."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.splitlines()
    drop: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            drop.update(range(node.lineno - 1, node.end_lineno))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop).rstrip() + "\n"


def inline_reference(callee: Callee, signature) -> str:
    target = callee.target
    if target.source_file is None or not target.source_file.is_file():
        raise ImportRefused(f"{target.description}: its source file is not available to copy; "
                            f"use the import form (--reference import) with an importable module")
    source = strip_main(target.source_file.read_text(encoding="utf-8"))
    init = "None"
    if target.is_module_class:
        if target.helper("get_init_inputs") is not None and callee.init_inputs == list(target.helper("get_init_inputs")()):
            init = "get_init_inputs"
        elif callee.init_inputs:
            init = "lambda: " + repr(list(callee.init_inputs))
    rule = "# " + "-" * 86
    return (f"{source}\n\n{rule}\n# specgen import: the spec's reference, calling {target.name} above\n"
            + adapter_body(target.name, init, signature))


# ------------------------------------------------------------------------------ all of it

def infer_spec(callee: Callee, *, name: str | None = None, reference: str = "auto",
               dtypes: list[str] | None = None, backward: str | None = None,
               description: str | None = None) -> ImportedSpec:
    """Run the probes and assemble the spec; `reference`: auto | inline | import."""
    runner = Runner(callee)
    shapes = probe_shapes(runner)
    name = name or op_name(callee)
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ImportRefused(f"{name!r} is not a valid op name; pass --name with a Python identifier")
    taken = {a.name for a in callee.arguments} | {name, "out"} | {f"out{k}" for k in range(len(runner.example_outputs))}
    name_symbols(shapes, runner, taken)
    flags = list(shapes.flags)
    working = working_dtype(runner)
    params = []
    for argument in callee.arguments:
        if isinstance(argument.value, torch.Tensor):
            params.append(f"{argument.name}: {tensor_text(runner, argument.name, argument.value, shapes, working, flags)}")
        else:
            text = scalar_text(argument, flags)
            if text:
                params.append(text)
    kept, out_dtypes = supported_dtypes(runner, shapes, working, flags, dtypes)
    outs = []
    for axes, dtype, output in zip(shapes.outputs, out_dtypes, runner.example_outputs):
        text = "Tensor[" + ", ".join(dim_text(s, mul, div, add, literal=add) for s, mul, div, add in axes) + "]"
        if dtype is not None:
            text += f" {dtype}"
            if dtype in INT_DTYPES:
                flags.append(f"an integer output ({dtype}): check that the kernel may compute it")
        outs.append(text)
    outputs = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    signature_text = f"{name}({', '.join(params)}) -> {outputs}"
    signature = parse_signature(signature_text)
    if backward is None:
        backward = "kernel" if differentiable(runner, shapes) else "none"
        if backward == "kernel":
            flags.append("backward: kernel, since the reference is differentiable; write backward: none for a "
                         "forward-only kernel, or reference to keep autograd through the reference")
    if "<locals>" in getattr(callee.target.obj, "__qualname__", ""):
        raise ImportRefused(f"{callee.target.description} is defined inside a function, so the spec can neither "
                            f"copy nor import it; define it at the top level of its module")
    mode = reference
    if mode == "auto":
        mode = "import" if callee.target.import_name else "inline"
    if mode == "import":
        if callee.target.import_name is None:
            module = callee.target.source_file.stem if callee.target.source_file else None
            if module is None:
                raise ImportRefused(f"{callee.target.description} cannot be imported by name; use --reference inline")
            flags.append(f"the reference imports {module}:{callee.target.name}: keep {module}.py beside the spec "
                         f"file, put its folder on PYTHONPATH, or install it (the wheel imports it too)")
        else:
            module = callee.target.import_name
        if callee.target.is_module_class and callee.init_inputs and (
                callee.target.helper("get_init_inputs") is None
                or list(callee.target.helper("get_init_inputs")()) != callee.init_inputs):
            raise ImportRefused("a module imported by path is built with its module's get_init_inputs(); these "
                                "init inputs differ from it: use --reference inline")
        reference_text = f"{module}:{callee.target.name}"
    elif mode == "inline":
        reference_text = inline_reference(callee, signature)
    else:
        raise ImportRefused(f"--reference {reference}: choose auto, inline or import")
    if any(a.state for a in callee.arguments):
        flags.append("the module's parameters and buffers are inputs of the spec ("
                     + ", ".join(a.name for a in callee.arguments if a.state)
                     + "); its constructor's arguments are constants of the reference")
    benchmark = [{s.name: s.value for s in shapes.symbols}] if shapes.symbols else []
    return ImportedSpec(
        name=name, description=description or describe(callee), signature=str(signature), dtypes=kept,
        dims={s.name: (s.lo, s.hi) for s in shapes.symbols}, reference=reference_text, backward=backward,
        benchmark=benchmark, flags=resolve_flags(flags, shapes.symbols), source=callee.target.description)


def describe(callee: Callee) -> str:
    for obj in (callee.target.obj, callee.target.module):
        doc = inspect.getdoc(obj) if obj is not None else None
        if doc and not (isinstance(obj, type) and doc == inspect.getdoc(torch.nn.Module)):
            first = doc.strip().split("\n\n")[0]
            return " ".join(first.split())
    return f"Imported from {callee.target.description}."
