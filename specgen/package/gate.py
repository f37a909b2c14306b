"""The last check before a kernel goes into a wheel: read what its compiled code calls.

A lock record says a kernel was verified; it does not prove it (anyone who can edit the specs
can edit the lock), and `--no-verify` packages kernels nobody ran. So every kernel that is
packaged goes through `toolchain.check_symbols`: file, process, network, environment and
dynamic-loading calls, and code that runs when the library is loaded (static constructors),
keep it out of the wheel, whatever the lock says.

What is checked is the object the wheel links: `specgen build` builds the wheel into a
staging folder, links each kernel's object from that build alone into a shared library
(`nvcc --shared -cudart shared`, as `toolchain.compile_kernel` links; a fraction of a
second) and reads its symbols; only a wheel whose kernels all pass leaves the staging
folder. So each kernel is compiled once per build (by the wheel's own nvcc run), and the check
sees exactly the code that ships. Where the build left no object for a kernel (or could
not build at all), `kernel_refusals` compiles the kernel alone, as before (cached by content).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def kernel_refusals(spec, source: str, *, arch: str | None = None) -> list[str]:
    """Why this kernel may not be packaged ([] = it may): the kernel compiled on its own."""
    from .. import abi
    from ..toolchain import CompileError, check_symbols, compile_kernel

    with tempfile.TemporaryDirectory(prefix="specgen-abi-") as header_dir:
        abi.write_header(spec, header_dir)
        try:
            compiled = compile_kernel(source, include_dirs=[Path(header_dir)], arch=arch, name=spec.name,
                                      source_name=f"kernels/{spec.name}.cu")
        except CompileError as error:
            return [f"it does not compile: {error.summary}"]
    return check_symbols(compiled.library, spec.libraries) + workspace_refusals(spec, source, compiled.library)


def workspace_refusals(spec, source: str | None, library: Path) -> list[str]:
    """abi.workspace_function_problems of the compiled kernel (nothing to compare without its source)."""
    from .. import abi
    from ..toolchain import defined_symbols

    return [] if source is None else abi.workspace_function_problems(spec, source, defined_symbols(library))


def built_object(tree: Path, name: str) -> Path | None:
    """The object the wheel build of `tree` compiled from kernels/NAME/NAME.cu (setuptools'
    build_temp of this interpreter), or None where there is none that is current."""
    source = Path(tree) / "kernels" / name / f"{name}.cu"
    found = sorted(Path(tree).glob(f"build/temp.*-{sys.implementation.cache_tag}/kernels/{name}/{name}.o"))
    if len(found) != 1 or not source.exists():
        return None
    if found[0].stat().st_mtime < source.stat().st_mtime:
        return None  # older than the source: not the object this build linked
    return found[0]


def object_refusals(spec, obj: Path, source: str | None = None) -> list[str]:
    """Why this kernel may not be packaged ([] = it may), from the object the wheel links:
    linked alone into a shared library against the shared CUDA runtime, then its symbols read
    (and, given the kernel's `source`, its size functions against the binding's calls)."""
    from ..toolchain import check_symbols, find_cuda_toolkit
    from ..procguard import run_guarded

    toolkit = find_cuda_toolkit()
    with tempfile.TemporaryDirectory(prefix="specgen-gate-") as scratch:
        library = Path(scratch) / f"{spec.name}.so"
        command = [str(toolkit.nvcc), "--shared", "-Xcompiler", "-fPIC", "-cudart", "shared",
                   "-Xlinker", f"-rpath={toolkit.cudart.parent}", str(obj), "-o", str(library)]
        returncode, log = run_guarded(command, cwd=scratch, timeout=300, cleanup=[scratch])
        if returncode != 0 or not library.exists():
            tail = "\n".join(log.strip().splitlines()[-5:])
            return [f"its compiled object could not be linked on its own for the symbol check:\n{tail}"]
        return check_symbols(library, spec.libraries) + workspace_refusals(spec, source, library)
