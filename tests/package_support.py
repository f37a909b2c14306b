"""Helpers for the tests of emitted packages (plain, saved, batched ops, layers, range checks):
importing an emitted tree as it is, and the binding's syntax check against the installed torch's
headers (one translation unit, syntax and types only; a built wheel's test links and loads one)."""
from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

CUDA_INCLUDE = Path("/usr/local/cuda/include")


@functools.cache
def unbatched_spec(path: Path):
    """The spec at `path` with every batch group `*S` written as the plain axis `S`: for tests of
    the plain op's registrations and messages (tests/test_batch_package.py checks the batched
    ones). Its kernel contract and spec hash are the same (the hash covers the folded signature)."""
    from specgen.spec import load_spec

    text = re.sub(r"Tensor\[\*(\w)", r"Tensor[\1", Path(path).read_text())
    copy = Path(tempfile.mkdtemp(prefix="unbatched-")) / Path(path).name
    copy.write_text(text)
    return load_spec(copy)


def import_tree(root: Path, name: str, module_name: str | None = None):
    """Import the package `name` of an emitted tree (under `module_name` when given), no _C built."""
    init = root / "torch-ext" / name / "__init__.py"
    spec = importlib.util.spec_from_file_location(module_name or name, init)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name or name] = module
    spec.loader.exec_module(module)
    return module


def binding_syntax_errors(root: Path, kernel_dirs: list[str]) -> str:
    """The compiler's errors for `root`'s torch-ext/torch_binding.cpp ("" when it compiles);
    `kernel_dirs`: the names under root/kernels whose headers it includes. Skips without a C++
    compiler or the CUDA headers."""
    import torch
    from torch.utils import cpp_extension

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None or not (CUDA_INCLUDE / "cuda_runtime.h").exists():
        pytest.skip("needs a C++ compiler and the CUDA headers")
    command = [cxx, "-std=c++20", "-fsyntax-only", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               "-DPy_LIMITED_API=0x03090000", f"-I{sysconfig.get_paths()['include']}", f"-I{CUDA_INCLUDE}",
               *[f"-I{p}" for p in cpp_extension.include_paths()],
               *[f"-I{root / 'kernels' / name}" for name in kernel_dirs],
               "-include", str(root / "torch-ext" / "glibc_compat.h"), str(root / "torch-ext" / "torch_binding.cpp")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    return "" if result.returncode == 0 else (result.stderr[-4000:] or f"exit {result.returncode}")


def run_generated_tests(root: Path, name: str, cwd: Path) -> subprocess.CompletedProcess:
    """The package's own tests (`<name>.tests`) run from the emitted tree's torch-ext/ (its CPU
    path: no _C is built), with -rA so that each test's outcome is in the output."""
    import os

    env = dict(os.environ, PYTHONPATH=str(root / "torch-ext"))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "--pyargs",
                           f"{name}.tests"], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)
