"""Run a spec's `reference:` block as its own module.

The source is compiled with blank lines in front, so Python's own line numbers are the
YAML file's line numbers: tracebacks and errors point straight into the spec.
"""
from __future__ import annotations

import traceback
import types
from typing import Callable

from .errors import Location, SpecError
from .reference_import import reference_code

_cache: dict[tuple[str, str], Callable] = {}


def reference_module(spec) -> types.ModuleType:
    filename = str(spec.path or f"<{spec.name}>")
    padded = "\n" * (spec.reference_line - 1) + reference_code(spec)  # an import path: its adapter
    module = types.ModuleType(f"specgen_reference_{spec.name}")
    module.__file__ = filename
    try:
        code = compile(padded, filename, "exec")
    except SyntaxError as error:
        raise SpecError(f"syntax error in the reference: {error.msg}",
                        location=Location(filename, error.lineno, error.offset), field="reference") from None
    try:
        exec(code, module.__dict__)
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as error:
        raise reference_failure(spec, error, "while loading the reference: a reference must define functions, "
                                             "never end the process") from None
    except Exception as error:  # the user's code: report where it failed, in the YAML
        raise reference_failure(spec, error, "while loading the reference") from None
    return module


def load_reference(spec) -> Callable:
    key = (str(spec.path), spec.hash())  # the path too: tracebacks must name this file
    if key in _cache:
        return _cache[key]
    module = reference_module(spec)
    fn = getattr(module, "reference", None)
    if not callable(fn):
        raise SpecError("the reference block must define a function named `reference`",
                        location=Location(spec.path or spec.name, spec.reference_line), field="reference",
                        hint="def reference(x, weight, eps=1e-5): ...")
    _cache[key] = fn
    return fn


def reference_failure(spec, error: BaseException, doing: str) -> SpecError:
    """A SpecError at the deepest traceback line that lies in the spec file."""
    filename = str(spec.path or f"<{spec.name}>")
    line = spec.reference_line
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename == filename:
            line = frame.lineno
    what = type(error).__name__
    if isinstance(error, SystemExit):
        what = f"sys.exit({error.code!r}) (SystemExit)"
    text = str(error)
    return SpecError(f"{what} {doing}" + (f": {text}" if text and not isinstance(error, SystemExit) else ""),
                     location=Location(filename, line), field="reference", hint=_device_hint(text))


# what torch says when a reference builds a tensor on a fixed device: CUDA asked for on a machine
# without it, or a CUDA tensor met the CPU inputs specgen check runs on
_DEVICE_ERRORS = ("NVIDIA driver", "Torch not compiled with CUDA", "CUDA driver", "no CUDA GPUs",
                  "Expected all tensors to be on the same device")


def _device_hint(text: str) -> str | None:
    if not any(mark in text for mark in _DEVICE_ERRORS):
        return None
    return ("the reference runs on its inputs' device (the CPU in `specgen check` and the CPU fallback, the GPU "
            "when a kernel is verified): build tensors with device=x.device (or torch.*_like(x)), never a fixed "
            "'cuda' or .cuda()")
