"""The last check before a kernel goes into a wheel: compile it alone and read what it calls.

A lock record says a kernel was verified; it does not prove it (anyone who can edit the specs
can edit the lock), and `--no-verify` packages kernels nobody ran. So every kernel that is
packaged is compiled on its own (cached by content: the verifier's compile of the same text
is reused) and its library goes through `toolchain.check_symbols`: file, process, network,
environment and dynamic-loading calls, and code that runs when the library is loaded (static
constructors), keep it out of the wheel, whatever the lock says.
"""
from __future__ import annotations

import tempfile
from pathlib import Path


def kernel_refusals(spec, source: str, *, arch: str | None = None) -> list[str]:
    """Why this kernel may not be packaged ([] = it may)."""
    from .. import abi
    from ..toolchain import CompileError, check_symbols, compile_kernel

    with tempfile.TemporaryDirectory(prefix="specgen-abi-") as header_dir:
        abi.write_header(spec, header_dir)
        try:
            compiled = compile_kernel(source, include_dirs=[Path(header_dir)], arch=arch, name=spec.name,
                                      source_name=f"kernels/{spec.name}.cu")
        except CompileError as error:
            return [f"it does not compile: {error.summary}"]
    return check_symbols(compiled.library, spec.libraries)
