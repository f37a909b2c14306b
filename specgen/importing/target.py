"""What `specgen import` starts from: a function or an nn.Module class, and example inputs.

`load_target("PATH.py:NAME" | "pkg.mod:NAME" | "PATH.py")` finds the object (a bare file
follows the KernelBench convention: `Model`, `get_inputs()`, `get_init_inputs()`), and
`Callee` gives both kinds one face: ordered named arguments (the forward's, then a
module's parameters and buffers) and `call(**kwargs)`.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import UsageError

KERNELBENCH_CLASS = "Model"
INPUTS_FUNCTION = "get_inputs"
INIT_INPUTS_FUNCTION = "get_init_inputs"


@dataclass
class Target:
    """The object to import, where it lives, and how to reach it again by import path."""

    obj: Any  # a function or an nn.Module subclass
    name: str  # its name in its module ("Model", "rms_ref")
    module: Any  # the Python module it was found in
    source_file: Path | None  # the module's file (inline references copy it)
    import_name: str | None  # a dotted module name importable from sys.path; None: loaded from a file
    description: str = ""  # what the reference is, for the user (e.g. "examples/x.py:Model")

    @property
    def is_module_class(self) -> bool:
        return isinstance(self.obj, type) and issubclass(self.obj, torch.nn.Module)

    def helper(self, name: str) -> Callable | None:
        fn = getattr(self.module, name, None) if self.module is not None else None
        return fn if callable(fn) else None


def _load_file(path: Path):
    """Import a .py file as a module named after it, its folder on sys.path (for its siblings)."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    module_name = f"_specgen_import_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the user's code
        sys.modules.pop(module_name, None)
        raise UsageError(f"{path}: importing it failed: {type(error).__name__}: {error}") from None
    return module


def load_target(text: str) -> Target:
    """`PATH.py:NAME`, `PATH.py` (KernelBench: NAME is Model) or `pkg.module:NAME`."""
    location, sep, name = text.rpartition(":") if ":" in text else (text, "", "")
    if location.endswith(".py") or (not sep and text.endswith(".py")):
        path = Path(location if sep else text)
        module = _load_file(path)
        name = name or KERNELBENCH_CLASS
        import_name = None
        description = f"{path}:{name}"
        source_file = path
    elif sep:
        try:
            module = importlib.import_module(location)
        except ImportError as error:
            raise UsageError(f"{text}: cannot import {location} ({error}); give PATH.py:NAME or put the "
                             f"package on PYTHONPATH") from None
        import_name = location
        description = text
        source_file = Path(module.__file__) if getattr(module, "__file__", None) else None
    else:
        raise UsageError(f"{text}: give PATH.py:NAME, PATH.py (a file with Model, get_inputs and "
                         f"get_init_inputs) or package.module:NAME")
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            known = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
            raise UsageError(f"{text}: {location or text} has no {name!r}; it defines: {', '.join(known) or 'nothing'}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{text}: {name} is not a function or an nn.Module class")
    return Target(obj, name, module, source_file, import_name, description)


def target_from_object(obj: Any) -> Target:
    """A Target for a Python object handed to the API (a function or an nn.Module class)."""
    if isinstance(obj, torch.nn.Module):
        raise UsageError("pass the nn.Module class (and init_inputs), not an instance: its parameters "
                         "become inputs of the spec and the reference builds the module itself")
    if not callable(obj):
        raise UsageError(f"{obj!r} is not a function or an nn.Module class")
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    try:
        source = inspect.getsourcefile(obj)
    except TypeError:
        source = None
    import_name = module.__name__ if module is not None and _importable(module) else None
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", "reference"))
    return Target(obj, name, module, Path(source) if source else None, import_name,
                  f"{getattr(module, '__name__', '?')}:{name}")


def _importable(module) -> bool:
    name = module.__name__
    if name == "__main__" or name.startswith("_specgen_import_"):
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ------------------------------------------------------------------------------ callee

@dataclass
class Argument:
    name: str
    value: Any  # the example value
    state: str | None = None  # a module's parameter or buffer: its dotted name
    default: Any = inspect.Parameter.empty


@dataclass
class Callee:
    """The target as a function of named arguments: forward's, then a module's state tensors."""

    target: Target
    arguments: list[Argument]
    module: torch.nn.Module | None = None
    init_inputs: list = field(default_factory=list)

    def call(self, **kwargs):
        if self.module is None:
            return self.target.obj(**kwargs)
        state = {a.state: kwargs[a.name] for a in self.arguments if a.state}
        rest = {a.name: kwargs[a.name] for a in self.arguments if not a.state and a.name in kwargs}
        return torch.func.functional_call(self.module, state, (), rest)


def _parameters(fn) -> list[inspect.Parameter]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise UsageError(f"{fn!r}: its signature cannot be read; wrap it in a plain def") from None
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise UsageError(f"{getattr(fn, '__qualname__', fn)}: *{p.name} / **{p.name} arguments cannot "
                             f"be named in a spec; give the function named parameters")
    return params


def make_callee(target: Target, example_inputs, init_inputs=None) -> Callee:
    """Bind example inputs (a list in argument order, or a dict by name) to the target."""
    module = None
    init = list(init_inputs or [])
    if target.is_module_class:
        try:
            module = target.obj(*init)
        except Exception as error:  # the user's constructor
            raise UsageError(f"{target.description}: building the module with init inputs {init!r} failed: "
                             f"{type(error).__name__}: {error}; give the constructor's arguments "
                             f"(get_init_inputs() or init_inputs=)") from None
        params = _parameters(module.forward)
    else:
        params = _parameters(target.obj)
    if isinstance(example_inputs, dict):
        unknown = [k for k in example_inputs if k not in {p.name for p in params}]
        if unknown:
            raise UsageError(f"{target.description}: example inputs name unknown argument(s) {', '.join(unknown)}")
        given = dict(example_inputs)
    else:
        values = list(example_inputs or [])
        if len(values) > len(params):
            raise UsageError(f"{target.description}: {len(values)} example inputs for {len(params)} arguments")
        given = {p.name: v for p, v in zip(params, values)}
    arguments = []
    for p in params:
        if p.name in given:
            arguments.append(Argument(p.name, given[p.name], default=p.default))
        elif p.default is not inspect.Parameter.empty:
            arguments.append(Argument(p.name, p.default, default=p.default))
        else:
            raise UsageError(f"{target.description}: no example input for argument {p.name!r}; "
                             f"give every argument without a default an example")
    if module is not None:
        taken = {a.name for a in arguments}
        for key, tensor in [*module.named_parameters(), *module.named_buffers()]:
            name = key.replace(".", "_")
            if name in taken:
                raise UsageError(f"{target.description}: the module's {key!r} and forward's argument {name!r} "
                                 f"would both be the spec input {name!r}; rename one")
            taken.add(name)
            arguments.append(Argument(name, tensor.detach(), state=key))
    return Callee(target, arguments, module, init)
