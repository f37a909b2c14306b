"""The built-in offline generator: lowers a spec's reference through torch.fx to CUDA.

trace.py (make_fx to prims) -> lower.py (row-program IR, ir.py) -> emit.py (CUDA) ->
generator.py (BuiltinAgent, generate_builtin: compile, verify + autotune on a GPU, lock).
interp.py evaluates the IR with torch on the CPU, to check a lowering without a GPU.
"""
from .generator import BuiltinAgent, GeneratedKernel, build_source, generate_builtin, lower_spec

__all__ = ["BuiltinAgent", "GeneratedKernel", "build_source", "generate_builtin", "lower_spec"]
