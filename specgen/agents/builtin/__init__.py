"""The built-in offline generator: lowers a spec's reference through torch.fx to CUDA.

trace.py (make_fx to prims) -> lower.py (row-program IR, ir.py) -> emit.py (CUDA) ->
generator.py (BuiltinAgent, generate_builtin: compile, verify + autotune on a GPU, lock).
interp.py evaluates the IR with torch on the CPU, to check a lowering without a GPU.

The names below load generator.py (and torch) on first use, not on import: the CLI's parser
reads tune.DEFAULT_BUDGET_S, and `specgen build --locked` needs no torch in its own process.
"""
__all__ = ["BuiltinAgent", "GeneratedKernel", "build_source", "generate_builtin", "lower_spec"]


def __getattr__(name: str):
    if name in __all__:
        from . import generator

        return getattr(generator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
