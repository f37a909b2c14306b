"""What the generated setup.py does for build time, read from its rendered text: the order the
compiles start in and the host compiler's flags. Fast: nothing is compiled."""
from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_package import SPECS, SWIGLU_CU  # noqa: E402

from specgen.package import package_model, render_files  # noqa: E402
from specgen.spec import load_spec  # noqa: E402


def _setup_py() -> str:
    return render_files(package_model("sgtime", [load_spec(SPECS / "swiglu.yaml")], {"swiglu": SWIGLU_CU}))["setup.py"]


def _setup_function(name: str, here: Path):
    """One function of the generated setup.py (the whole file runs setup()), its HERE set to `here`."""
    node = next(n for n in ast.parse(_setup_py()).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = {"os": os, "HERE": str(here)}
    exec(compile(ast.Module([node], []), "setup.py", "exec"), scope)
    return scope[name]


def _write(tree: Path, relative: str, size: int) -> str:
    path = tree / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return relative


def test_the_binding_starts_first_then_the_kernels_largest_first(tmp_path):
    binding = _write(tmp_path, "torch-ext/torch_binding.cpp", 30_000)
    shims = _write(tmp_path, "torch-ext/glibc_shims.cpp", 500)
    small = _write(tmp_path, "kernels/gelu/gelu.cu", 40_000)
    large = _write(tmp_path, "kernels/layernorm/layernorm.cu", 60_000)
    tie_b = _write(tmp_path, "kernels/b/b.cu", 45_000)
    tie_a = _write(tmp_path, "kernels/a/a.cu", 45_000)
    longest_first = _setup_function("longest_first", tmp_path)
    as_setuptools_gives = sorted([binding, shims, small, large, tie_b, tie_a])
    # the binding, though smaller than every kernel here, is the longest compile (torch's headers)
    assert longest_first(as_setuptools_gives) == [binding, large, tie_a, tie_b, small, shims]


def test_the_build_links_in_setuptools_order_whatever_the_compile_order():
    setup = _setup_py()
    assert "class LongestFirst(BuildExtension)" in setup and '"build_ext": build_ext()' in setup
    # the objects come back in the order the sources were given: the link line, so the bytes, do not change
    assert "return [objects[source] for source in sources]" in setup


def test_the_binding_compiles_without_debug_info_and_the_kernels_keep_their_flags():
    setup = _setup_py()
    cxx = setup.split('"cxx": [')[1].split("]")[0]
    nvcc = setup.split('"nvcc": [')[1].split("]")[0]
    assert '"-O2", "-g0"' in cxx  # after Python's -g (torch's rule puts these flags last): no debug info
    assert '"-O3"' in nvcc and "-g" not in nvcc and "-O1" not in nvcc  # the device code's flags as verified
    assert '"-s"' in setup.split("extra_link_args=[")[1].split("]")[0]  # the link strips what -g would add
