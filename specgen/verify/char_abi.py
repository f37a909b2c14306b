"""The candidate built with plain `char` unsigned, and run (verifier version 16).

Plain `char` is signed on x86-64 and unsigned on aarch64 (the AArch64 Linux ABI): the same sm_90
GPU behind a GH200 Grace Hopper host runs a package built there, whose host code reads a stored
-1 in a `char` as 255. Held-out attacks-v11's layernorm_gelu_a kept `struct Plan { int threads;
char rows_log2; }` with -1 for "a block per row" and tested `rows_log2 >= 0`: on aarch64 every row
took the warp-per-row path that holds 1024 elements, wrong for every wider row. Every other case
runs the x86-64 build; the device code is the same on both hosts.

So the candidate is compiled a second time with the host compiler told `-funsigned-char`
(`-Xcompiler -funsigned-char` through nvcc; the device code is unchanged), cached like the normal
build (toolchain.compile_kernel keys on the flags), and that build runs in a process of its own on
a few cases per direction: the smoke case and rows wider than 1024 (1280 and 4096, or the widest
the range allows), dtypes in turn, each checked as any case is. A static comparison of the two
builds would not do: a plan that differs only for wide rows has to meet one. A build that does
not compile with plain char unsigned (`Plan{256, -1}`: a narrowing error there) is a
compile-error. Both carry the prefix below and the fix.
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

UNSIGNED_CHAR_FLAGS = ("-Xcompiler", "-funsigned-char")
PREFIX = "built with plain char unsigned (as on aarch64 hosts such as GH200)"
HINT = ("Plain `char` is signed on x86-64 and unsigned on aarch64: where a char holds a negative value (a -1 "
        "marker, a signed byte), declare it `signed char` or `int8_t`")
WIDE_ROWS = (1280, 4096)  # rows wider than 1024 (a warp-per-row path of 32 lanes x 32 registers holds 1024)


def build_unsigned_char(spec, kernel, *, arch: str | None = None, cache_dir: Path | None = None):
    """The candidate compiled with plain char unsigned (cached by content and flags, as the normal
    build): its CompiledKernel. A compile error is a Failure (compile-error) with the prefix."""
    from ..abi import write_header
    from ..toolchain import CompileError, compile_kernel
    from .verdict import COMPILE_ERROR, Failure

    with tempfile.TemporaryDirectory(prefix="specgen-abi-") as header_dir:
        write_header(spec, header_dir)
        source_name = str(kernel) if isinstance(kernel, Path) or "\n" not in str(kernel) else f"{spec.name}.cu"
        try:
            return compile_kernel(kernel, include_dirs=[Path(header_dir)], arch=arch, name=f"{spec.name}-unsigned-char",
                                  source_name=source_name, extra_flags=UNSIGNED_CHAR_FLAGS, cache_dir=cache_dir)
        except CompileError as error:
            raise Failure(COMPILE_ERROR, f"{PREFIX} (-Xcompiler -funsigned-char), it does not compile: "
                                         f"{str(error)[:3000]}. {HINT}") from None


def unsigned_char_cases(spec, budget: int, seed: int) -> list:
    """The smoke case, then rows of WIDE_ROWS (clamped to the row's range, only those wider than
    the smoke case's), a few rows each within the budget; the spec's dtypes in turn."""
    from .strategies import fit_budget, legal_sizes, make_case, row_symbol, smoke_case

    sig = spec.signature
    smoke = smoke_case(spec, seed)
    cases = [smoke]
    row = row_symbol(sig)
    if row is not None:
        lo, hi = spec.dims[row]
        for width in legal_sizes(lo, hi, sig.symbol_divisors().get(row, 1), WIDE_ROWS):
            if width > smoke.dim_map[row]:
                dims = fit_budget(sig, {**smoke.dim_map, row: width}, spec.dims, budget, keep=row)
                cases.append(make_case(dims, spec.dtypes[0], seed=seed + len(cases)))
    return [dataclasses.replace(case, dtype=spec.dtypes[k % len(spec.dtypes)]) for k, case in enumerate(cases)]


def unsigned_char_runner(spec, options, device: str, isolated: bool, isolated_runner):
    """A factory of runners of the unsigned-char build (a process of its own on a GPU: `isolated_runner(build=path)`;
    a LocalRunner otherwise), or None when the verification was given no such build (a stand-in)."""
    path = getattr(options, "unsigned_char_library", None)
    if not path:
        return None
    if isolated:
        return lambda: isolated_runner(build=path)
    from .isolation import LocalRunner

    return lambda: LocalRunner(spec, path, device)


def check_unsigned_char(session, direction: str) -> None:
    """The unsigned-char build on unsigned_char_cases, each case checked as any case (check_case);
    nothing where the session has no such build (`session.unsigned_char_runner` None)."""
    from .checks import check_case
    from .data import stage
    from .verdict import Failure

    factory = getattr(session, "unsigned_char_runner", None)
    if factory is None:
        return
    spec = session.spec
    cases = unsigned_char_cases(spec, session.options.budget, session.options.seed + 8200)
    session.progress(f"{direction}: the build with plain char unsigned (as on aarch64 hosts), "
                     + ", ".join(case.describe() for case in cases))
    runner = None
    try:
        runner = factory()
        for case in cases:
            data = session.prepare(case, direction)
            stage(runner, data, snapshots=not runner.readonly_inputs)
            session.cases += 1
            check_case(runner, data, deterministic=spec.deterministic, stats=session.stats(case, direction, data))
            del data
    except Failure as failure:
        raise Failure(failure.reason, f"{PREFIX}: {failure.detail}. {HINT}", failure.counterexample,
                      fatal=failure.fatal) from None
    finally:
        if runner is not None:
            runner.close()
