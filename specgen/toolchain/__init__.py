"""The CUDA toolchain: find the toolkit (`cuda`), compile a candidate `.cu` into a cached
shared library (`compile`), turn nvcc's output into short diagnostics (`diagnostics`), and
read the library's symbols (`symbols`).

A candidate is built against the *shared* CUDA runtime (`-cudart shared`) so that its
undefined dynamic symbols say exactly what it calls; `check_symbols` refuses anything
beyond the CUDA runtime and the C/C++ runtime (docs/VERIFIER.md).
"""
from .compile import (CompiledKernel, CompileError, compile_kernel, default_cache_dir, parse_module_memory,
                      parse_resources, read_source)
from .cuda import CudaToolkit, detect_gpu_arch, find_cuda_toolkit
from .diagnostics import Diagnostic, format_diagnostics, parse_diagnostics
from .symbols import (DynamicSymbol, check_symbols, defined_symbols, needed_libraries, stream_calls,
                      undefined_dynamic_symbols, undefined_symbols)

__all__ = ["CompileError", "CompiledKernel", "CudaToolkit", "Diagnostic", "DynamicSymbol", "check_symbols",
           "compile_kernel", "default_cache_dir", "defined_symbols", "detect_gpu_arch", "find_cuda_toolkit",
           "format_diagnostics", "needed_libraries", "parse_diagnostics", "parse_module_memory", "parse_resources",
           "read_source", "stream_calls",
           "undefined_dynamic_symbols", "undefined_symbols"]
