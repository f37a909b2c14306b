"""`reference: mypkg.ops:rms_ref`: a reference imported by path instead of written inline.

A spec's `reference:` is either a Python block defining `reference(...)` or one line
`module.path:name`. The named object is

- a function: called with the signature's arguments (by name), as an inline reference is;
- an `nn.Module` class: built once, with its module's `get_init_inputs()` when there is one
  (the KernelBench convention), and called through `torch.func.functional_call`; its
  parameters and buffers are the spec's tensor inputs named after them ('.' written '_'),
  the other inputs go to `forward` by name.

`reference_code(spec)` turns either form into Python source defining `reference`, so
everything downstream (check, the verifier, the builtin tracer, the packaged wheel's
`_reference_<op>.py`) runs one kind of text. The module is imported from the Python path,
then from the spec's folder; a packaged wheel imports it from the user's installation, so
model code is never copied. The spec hash covers the module file's bytes
(`reference_fingerprint`): editing the model makes its locked kernel stale.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path

from .errors import Location, SpecError

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
IMPORT_PATH = re.compile(rf"\s*(?P<module>{_DOTTED}):(?P<name>{_DOTTED})\s*\Z")


def import_path(text: str) -> tuple[str, str] | None:
    """(module, name) when `text` is `module.path:name` on one line, else None."""
    match = IMPORT_PATH.fullmatch(text or "")
    return (match.group("module"), match.group("name")) if match else None


def is_import_path(text: str) -> bool:
    return import_path(text) is not None


def adapter_source(module: str, name: str, signature) -> str:
    """Python source defining `reference` with the signature's parameters, from module:name."""
    first, _, rest = name.partition(".")
    head = (f"from {module} import {first} as _sg_target  # reference: {module}:{name} (imported, not copied)\n"
            f"import importlib as _sg_importlib\n")
    init = f"getattr(_sg_importlib.import_module({module!r}), 'get_init_inputs', None)"
    return head + adapter_body(f"_sg_target{'.' + rest if rest else ''}", init, signature)


def adapter_body(target: str, init: str, signature) -> str:
    """The adapter calling `target` (expression) as the spec's `reference`; `init` (an
    expression: a callable or None) gives an nn.Module class its constructor's arguments."""
    params = ", ".join(_param_text(p) for p in signature.params)
    call = ", ".join(f"{p.name}={p.name}" for p in signature.params)
    return (f"import torch as _sg_torch\n"
            f"\n"
            f"\n"
            f"def _sg_adapt(target, init=None):\n"
            f"    \"\"\"A function as it is; an nn.Module class built once (with init()'s arguments) and\n"
            f"    called with its parameters and buffers taken from the inputs named after them ('.'\n"
            f"    written '_'), its other inputs going to forward by name.\"\"\"\n"
            f"    if not (isinstance(target, type) and issubclass(target, _sg_torch.nn.Module)):\n"
            f"        return target\n"
            f"    module = target(*(init() if init else ()))\n"
            f"    state = {{key.replace('.', '_'): key for key, _ in\n"
            f"             [*module.named_parameters(), *module.named_buffers()]}}\n"
            f"\n"
            f"    def call(**kwargs):\n"
            f"        tensors = {{state[k]: v for k, v in kwargs.items() if k in state}}\n"
            f"        rest = {{k: v for k, v in kwargs.items() if k not in state}}\n"
            f"        return _sg_torch.func.functional_call(module, tensors, (), rest)\n"
            f"\n"
            f"    return call\n"
            f"\n"
            f"\n"
            f"_sg_reference = _sg_adapt({target}, {init})\n"
            f"\n"
            f"\n"
            f"def reference({params}):\n"
            f"    return _sg_reference({call})\n")


def _param_text(param) -> str:
    if not param.has_default:
        return param.name
    from .signature import format_scalar

    value = format_scalar(param.default)
    if value in ("inf", "-inf", "nan"):
        value = f"float({value!r})"
    return f"{param.name}={value}"


def reference_code(spec, *, resolve: bool = True) -> str:
    """The Python source of the spec's reference (an import path becomes its adapter).

    `resolve`: also make the module importable (the spec's folder joins the end of
    sys.path) and fail with a SpecError naming the module when it cannot be found."""
    found = import_path(spec.reference_source)
    if found is None:
        return spec.reference_source
    if resolve:
        module_file(spec)
    return adapter_source(*found, spec.signature)


def _search_spec_folder(spec) -> None:
    if spec.path is not None:
        folder = str(Path(spec.path).resolve().parent)
        if folder not in sys.path:
            sys.path.append(folder)


def module_file(spec) -> Path:
    """The file of the reference's module; SpecError when it cannot be imported."""
    module, name = import_path(spec.reference_source)
    _search_spec_folder(spec)
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as error:
        found, detail = None, f"{type(error).__name__}: {error}"
    else:
        detail = f"no module named {module!r}"
    where = Location(spec.path or f"<{spec.name}>", spec.reference_line)
    if found is None:
        raise SpecError(f"cannot import the reference {module}:{name} ({detail})", location=where,
                        field="reference",
                        hint="install the package that defines it, put its folder on PYTHONPATH, or keep the "
                             "module beside the spec file")
    if not found.origin or not Path(found.origin).is_file():
        raise SpecError(f"the reference's module {module} has no source file ({found.origin})",
                        location=where, field="reference", hint="reference a module written in Python")
    return Path(found.origin)


def reference_fingerprint(spec) -> dict | None:
    """For an import-path reference: the module and the sha256 of its file (spec hash input)."""
    found = import_path(spec.reference_source)
    if found is None:
        return None
    path = module_file(spec)
    return {"module": found[0], "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def reference_display(spec) -> str:
    """What a person (or an LLM prompt) should read as the reference: inline text as it is;
    for an import path, the module's source followed by the adapter that calls it."""
    found = import_path(spec.reference_source)
    if found is None:
        return spec.reference_source
    try:
        source = module_file(spec).read_text(encoding="utf-8")
    except (SpecError, OSError, UnicodeDecodeError):
        source = "# (the module's source is not available here)\n"
    return (f"# module {found[0]} (the reference imports {found[0]}:{found[1]}):\n{source.rstrip()}\n\n"
            f"# the spec's reference, calling it:\n{adapter_source(*found, spec.signature)}")
