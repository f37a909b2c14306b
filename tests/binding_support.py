"""The package binding's syntax check against the installed torch's headers: one translation
unit, syntax and types only (a built wheel's test links and loads one). Shared by the package
tests of plain, saved and batched ops."""
from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

CUDA_INCLUDE = Path("/usr/local/cuda/include")


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
