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


def _setup_value(name: str):
    """A module-level constant of the generated setup.py (a literal)."""
    node = next(n for n in ast.parse(_setup_py()).body
                if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == name for t in n.targets))
    return ast.literal_eval(node.value)


def _nvcc_flags() -> list[str]:
    """The nvcc flags of the generated setup.py: its literal strings and module constants (the arch
    list's gencode flags and the paths, computed at build time, aside)."""
    tree = ast.parse(_setup_py())
    value = next(v for d in ast.walk(tree) if isinstance(d, ast.Dict)
                 for k, v in zip(d.keys, d.values) if isinstance(k, ast.Constant) and k.value == "nvcc")

    def flags(node) -> list[str]:
        if isinstance(node, ast.BinOp):
            return flags(node.left) + flags(node.right)
        if isinstance(node, ast.List):
            return [e.value for e in node.elts if isinstance(e, ast.Constant)]
        if isinstance(node, ast.Name) and node.id.isupper():
            return _setup_value(node.id)
        return []

    return flags(value)


def test_the_binding_compiles_without_debug_info_and_the_kernels_keep_their_flags():
    setup = _setup_py()
    cxx = setup.split('"cxx": [')[1].split("]")[0]
    assert '"-O2", "-g0"' in cxx  # after Python's -g (torch's rule puts these flags last): no debug info
    flags = _nvcc_flags()
    assert not any(flag.startswith(("-g", "-G", "-lineinfo", "-Xptxas", "-Xcicc", "--use_fast_math")) for flag in flags)
    assert '"-s"' in setup.split("extra_link_args=[")[1].split("]")[0]  # the link strips what -g would add


def test_the_kernels_host_code_is_compiled_at_O1_and_nothing_reaches_the_device_passes():
    """nvcc's -O is the host compiler's alone; the flags say so explicitly (-Xcompiler), with no
    nvcc -O left that a later reader might take for the device code's level."""
    flags = _nvcc_flags()
    assert "-Xcompiler=-O1" in flags
    assert not any(flag.startswith(("-O", "--optimize", "-dopt", "--dopt")) for flag in flags)


def test_the_binding_skips_gccs_early_collections_only_with_gcc(monkeypatch, tmp_path):
    setup = _setup_py()
    assert "+ (GCC_NO_EARLY_GC if host_compiler_is_gcc() else [])" in setup
    assert _setup_value("GCC_NO_EARLY_GC") == ["--param=ggc-min-heapsize=2097152", "--param=ggc-min-expand=100"]
    node = next(n for n in ast.parse(setup).body if isinstance(n, ast.FunctionDef) and n.name == "host_compiler_is_gcc")
    import subprocess

    scope = {"os": os, "subprocess": subprocess}
    exec(compile(ast.Module([node], []), "setup.py", "exec"), scope)
    is_gcc = scope["host_compiler_is_gcc"]
    for name, version in (("gcc", "c++ (Ubuntu 12.3.0-1ubuntu1~22.04) 12.3.0\nCopyright (C) 2022 Free Software Foundation, Inc."),
                          ("clang", "Ubuntu clang version 18.1.3\nTarget: x86_64-pc-linux-gnu")):
        fake = tmp_path / name
        fake.write_text(f"#!/bin/sh\nprintf '{version}\\n'\n")
        fake.chmod(0o755)
        monkeypatch.setenv("CXX", str(fake))
        assert is_gcc() == (name == "gcc")
    monkeypatch.setenv("CXX", str(tmp_path / "missing"))
    assert is_gcc() is False


def test_build_skips_its_own_dependency_check_and_build_wheel_checks_the_requirements(tmp_path, monkeypatch):
    """`python -m build -x`: no extra Python process asks setup.py for its requirements (~2 s);
    build_wheel checks the [build-system] requirements in-process instead, as `build` would."""
    import importlib.util

    from specgen.errors import EnvironmentMissing
    from specgen.package import wheel

    if importlib.util.find_spec("build") is not None:
        command = wheel._build_command(tmp_path, tmp_path / "dist")
        assert command[1:3] == ["-m", "build"] and "--skip-dependency-check" in command and "--no-isolation" in command
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=1", "pytest>=99", "no-such-dist-sg", '
        '"no-such-dist-marked; python_version < \'3\'"]\nbuild-backend = "setuptools.build_meta"\n')
    assert wheel.missing_build_requirements(tmp_path) == ["pytest>=99", "no-such-dist-sg"]
    monkeypatch.setattr(wheel, "_build_command", lambda *a, **kw: [sys.executable, "-m", "build",
                                                                    "--skip-dependency-check"])
    try:
        wheel.build_wheel(tmp_path, tmp_path / "dist", needs_cuda=False)
    except EnvironmentMissing as error:
        assert "pytest>=99" in str(error) and "no-such-dist-sg" in str(error) and "pip install" in str(error)
    else:
        raise AssertionError("a missing build requirement did not stop the build")


def test_a_generated_packages_build_requirements_are_met_here(tmp_path):
    from specgen.package import wheel

    (tmp_path / "pyproject.toml").write_text(render_files(package_model(
        "sgreq", [load_spec(SPECS / "swiglu.yaml")], {"swiglu": SWIGLU_CU}))["pyproject.toml"])
    assert wheel.missing_build_requirements(tmp_path) == []
