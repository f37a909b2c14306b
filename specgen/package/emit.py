"""Renders templates/package/ for a PackageModel into a package tree (atomic file writes).

Tree: pyproject.toml, setup.py, MANIFEST.in, build.toml, README.md, LICENSE,
torch-ext/torch_binding.cpp (the one C++ translation unit), torch-ext/<pkg>/ (Python API,
registrations (_ops.py: ops_runtime.py, verbatim), embedded references, tests), kernels/<op>/<op>.cu + <op>_abi.h and, when an op
with a kernel has an integer input with a value range, torch-ext/range_check.cu + .h (the
device check of those values, launched by the binding).
"""
from __future__ import annotations

import json
import pprint
import shutil
from pathlib import Path

import jinja2

from ..fsutil import write_atomic
from ..abi import DTYPE_CODES
from ..signature import INT_DTYPES
from .model import SCALAR_TYPES, PackageModel
from .summary import performance_summary

TEMPLATES = Path(__file__).resolve().parent.parent / "templates" / "package"  # installed: specgen/templates
RANGE_CTYPES = {name: f"{name}_t" for name in INT_DTYPES}  # the C type of each integer dtype
# plain modules, copied verbatim: the package's data (_spec_data.py) is what differs
LAYER_RUNTIME = Path(__file__).resolve().parent / "layer_runtime.py"
OPS_RUNTIME = Path(__file__).resolve().parent / "ops_runtime.py"


def _templates_dir() -> Path:
    if TEMPLATES.is_dir():
        return TEMPLATES
    return Path(__file__).resolve().parents[2] / "templates" / "package"  # a source checkout


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_templates_dir())), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["pyrepr"] = lambda value: pprint.pformat(value, width=100, sort_dicts=False)
    env.filters["pydoc"] = docstring_text
    env.filters["tomlstr"] = json.dumps  # a TOML basic string (JSON escapes are TOML escapes)
    env.filters["cstr"] = json.dumps  # a C++ string literal (ASCII; JSON escapes are C escapes)
    env.filters["prefixed"] = lambda value, prefix: f"{prefix}{value}"
    env.filters["cindex"] = lambda value: f"[{value}]"
    env.filters["tuple_get"] = lambda index, name: f"std::get<{index}>({name})"
    env.filters["num"] = lambda value, digits=1: "–" if value is None else f"{value:.{digits}f}"
    env.filters["times"] = lambda value: "–" if value is None else f"{value:.2f}x"
    env.filters["percent"] = lambda value: "–" if value is None else f"{value:.0%}"
    env.filters["dims"] = lambda value: (", ".join(f"{k}={v}" for k, v in value.items())
                                         if isinstance(value, dict) else str(value))
    return env


def docstring_text(value) -> str:
    """User text made safe inside a triple-quoted Python docstring: backslashes and quotes
    escaped (no `\"\"\"` can end it, no `\\u` can break it), other control characters as escapes."""
    out = []
    for char in str(value):
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char in "\n\t" or (char.isprintable() and not 0xD800 <= ord(char) <= 0xDFFF):
            out.append(char)
        else:
            out.append(char.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def render_files(pkg: PackageModel) -> dict[str, str]:
    """Relative path -> text, for every file of the package tree."""
    env = environment()
    context = _with_provenance({"pkg": pkg, "scalar_types": SCALAR_TYPES,
                                "ops_data": {op.name: op.data() for op in pkg.ops},
                                "provenance_data": {op.name: _plain(op.provenance) for op in pkg.ops},
                                "range_sites_data": [(op.name, t.name) for op, t in pkg.range_sites],
                                "summary": performance_summary(pkg),
                                "dtype_codes": DTYPE_CODES, "range_dtypes": INT_DTYPES,
                                "range_ctypes": RANGE_CTYPES})
    py = f"torch-ext/{pkg.name}"
    files = {
        "pyproject.toml": env.get_template("pyproject.toml.j2").render(context),
        "setup.py": env.get_template("setup.py.j2").render(context),
        "MANIFEST.in": env.get_template("MANIFEST.in.j2").render(context),
        "build.toml": env.get_template("build.toml.j2").render(context),
        "README.md": env.get_template("README.md.j2").render(context),
        f"{py}/__init__.py": env.get_template("torch-ext/pkg/__init__.py.j2").render(context),
        f"{py}/_ops.py": OPS_RUNTIME.read_text(),
        f"{py}/_spec_data.py": env.get_template("torch-ext/pkg/_spec_data.py.j2").render(context),
        f"{py}/layers.py": env.get_template("torch-ext/pkg/layers.py.j2").render(context),
        f"{py}/_patching.py": LAYER_RUNTIME.read_text(),
        f"{py}/__init__.pyi": env.get_template("torch-ext/pkg/__init__.pyi.j2").render(context),
        f"{py}/py.typed": "",  # PEP 561: the package ships its types (inline and __init__.pyi)
        "LICENSE": (_templates_dir() / "LICENSE").read_text(),  # the repo's license (Apache-2.0)
        f"{py}/tests/__init__.py": "",
        f"{py}/tests/test_ops.py": env.get_template("torch-ext/pkg/tests/test_ops.py.j2").render(context),
    }
    if pkg.has_kernels:
        files["torch-ext/torch_binding.cpp"] = env.get_template("torch-ext/torch_binding.cpp.j2").render(context)
        files["torch-ext/glibc_compat.h"] = env.get_template("torch-ext/glibc_compat.h.j2").render(context)
        files["torch-ext/glibc_shims.cpp"] = env.get_template("torch-ext/glibc_shims.cpp.j2").render(context)
    if pkg.range_sites:
        files["torch-ext/range_check.h"] = env.get_template("torch-ext/range_check.h.j2").render(context)
        files["torch-ext/range_check.cu"] = env.get_template("torch-ext/range_check.cu.j2").render(context)
    reference = env.get_template("torch-ext/pkg/_reference.py.j2")
    for op in pkg.ops:
        files[f"{py}/_reference_{op.name}.py"] = reference.render(context, op=op)
        if op.has_kernel:
            files[f"kernels/{op.name}/{op.name}.cu"] = op.kernel_source
            files[f"kernels/{op.name}/{op.name}_abi.h"] = op.header_text
    return files


class _Provenance(dict):
    """Attribute access with None for what is missing, so templates stay simple."""

    def __getattr__(self, key):
        value = self.get(key)
        return _Provenance(value) if isinstance(value, dict) else value


def _plain(value):
    """JSON-able plain data (the provenance is written into the package as a Python literal)."""
    return json.loads(json.dumps(value, default=str))


def _with_provenance(context: dict) -> dict:
    # OpModel is frozen; templates read op.provenance.<key>, missing keys are None.
    pkg = context["pkg"]
    for op in pkg.ops:
        if not isinstance(op.provenance, _Provenance):
            object.__setattr__(op, "provenance", _Provenance(op.provenance))
    return context


def emit_package(pkg: PackageModel, out_dir: str | Path, *, clean: bool = True) -> Path:
    """Write the package tree into out_dir (emptied first when `clean`); returns out_dir."""
    out = Path(out_dir)
    files = render_files(pkg)
    if clean and out.exists():
        for child in out.iterdir():
            if child.name in ("build", "dist") or child.name.endswith(".egg-info"):
                continue  # keep build caches: ninja reuses unchanged objects
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    for relative, text in files.items():
        write_atomic(out / relative, text)
    return out
