"""`specgen compile SPEC --kernel FILE.cu`: compile a candidate against the spec's ABI header."""
from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_OK, EXIT_REJECTED


def register(subparsers) -> None:
    p = subparsers.add_parser("compile", help="compile a candidate kernel into a shared library (cached)",
                              description="Compile FILE.cu against SPEC's ABI header with nvcc into a cached "
                                          "shared library; print its path, the per-kernel resources and any "
                                          "diagnostics, and check the library's symbols. No GPU needed.")
    p.add_argument("spec", metavar="SPEC", help="a spec file")
    p.add_argument("--kernel", required=True, metavar="FILE.cu", help="the candidate kernel source")
    p.add_argument("--arch", default=None, help="GPU architecture, e.g. sm_90 (default: the visible GPU, else sm_90)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON to OUT")
    p.set_defaults(func=run)


def run(args) -> int:
    from . import kernel_argument
    from ..abi import write_header
    from ..fsutil import write_atomic
    from ..spec import load_spec
    from ..toolchain import CompileError, check_symbols, compile_kernel

    spec = load_spec(args.spec)
    kernel = kernel_argument(args.kernel)
    with tempfile.TemporaryDirectory(prefix="specgen-abi-") as header_dir:
        write_header(spec, header_dir)
        try:
            result = compile_kernel(kernel, include_dirs=[Path(header_dir)], arch=args.arch, name=spec.name,
                                    source_name=args.kernel)
        except CompileError as error:
            if args.json:
                write_atomic(args.json, json.dumps({"ok": False, "kernel": args.kernel, "error": error.summary,
                                                    "diagnostics": [asdict(d) for d in error.diagnostics]},
                                                   indent=2) + "\n")
            raise
    violations = check_symbols(result.library, spec.libraries)

    console = Console(highlight=False)
    state = "[green]cache hit[/]" if result.cached else "cache miss"
    console.print(f"{escape(str(result.library))}  ({state}, {result.seconds:.2f} s, {result.arch})")
    if result.resources:
        table = Table(title="resources per kernel (ptxas -v)")
        table.add_column("kernel", overflow="fold", ratio=1)
        for column in ("regs", "smem B", "stack B", "spill st B", "spill ld B"):
            table.add_column(column, justify="right", no_wrap=True)
        for kernel_name, info in result.resources.items():
            table.add_row(escape(kernel_name), *(str(info.get(key)) for key in (
                "registers", "shared_bytes", "stack_bytes", "spill_store_bytes", "spill_load_bytes")))
        console.print(table)
    if result.module_memory_bytes:
        console.print(f"module memory (`__device__`/`__managed__` variables): {result.module_memory_bytes} bytes")
    for diagnostic in result.diagnostics:
        console.print(f"[yellow]{escape(str(diagnostic))}[/]")
    for violation in violations:
        console.print(f"[bold red]refused symbol:[/] {escape(violation)}")
    if args.json:
        write_atomic(args.json, json.dumps({
            "ok": not violations, "kernel": args.kernel, "library": str(result.library), "cached": result.cached,
            "seconds": result.seconds, "arch": result.arch, "source_hash": result.source_hash,
            "cache_key": result.cache_key, "resources": result.resources,
            "module_memory_bytes": result.module_memory_bytes,
            "diagnostics": [asdict(d) for d in result.diagnostics], "symbol_violations": violations,
        }, indent=2) + "\n")
    return EXIT_REJECTED if violations else EXIT_OK
