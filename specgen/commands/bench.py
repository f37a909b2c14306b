"""`specgen bench SPEC [--kernel FILE.cu]`: time a kernel, eager PyTorch and torch.compile side by side."""
from __future__ import annotations

import tempfile
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_OK, EXIT_REJECTED, EnvironmentMissing, Rejected, UsageError
from . import positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark a kernel against eager PyTorch and torch.compile (GPU)",
                              description="Time the candidate (if given), the reference in eager PyTorch and "
                                          "torch.compile of the reference on the same inputs: CUDA events, "
                                          "warm-up, median of many runs, L2 flushed between runs, rotating input "
                                          "sets; against the device-to-device copy bandwidth measured in the "
                                          "same run.")
    p.add_argument("spec", metavar="SPEC", help="a spec file")
    p.add_argument("--kernel", default=None, metavar="FILE.cu", help="the candidate kernel source")
    p.add_argument("--shape", action="append", default=None, metavar="N=16384,D=4096",
                   help="a shape to time (repeatable; default: the spec's benchmark shapes)")
    p.add_argument("--dtype", action="append", default=None, help="a dtype to time (repeatable; default: all)")
    p.add_argument("--reps", type=positive_int, default=None, help="timed runs per measurement (default 40)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--arch", default=None, help="GPU architecture, e.g. sm_90 (default: the visible GPU)")
    p.add_argument("--json", default=None, metavar="OUT",
                   help="also write the results as JSON to OUT ('-': stdout); `specgen report --bench OUT` reads it")
    p.set_defaults(func=run)


def parse_shape(text: str, symbols: list[str], ranges: dict[str, tuple[int, int]] | None = None) -> dict[str, int]:
    """`N=16384,D=4096` -> {N: 16384, D: 4096}; every symbol once, each within the spec's dims."""
    dims = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in symbols or not value.strip().isascii() or not value.strip().isdigit() or len(value) > 12:
            raise UsageError(f"--shape {text}: write SYMBOL=SIZE pairs over {', '.join(symbols)}, "
                             f"e.g. {','.join(f'{s}=1024' for s in symbols)}")
        dims[name] = int(value)
    missing = [s for s in symbols if s not in dims]
    if missing:
        raise UsageError(f"--shape {text}: no size for {', '.join(missing)}")
    for name, value in dims.items():
        lo, hi = (ranges or {}).get(name, (0, value))
        if not lo <= value <= hi:
            raise UsageError(f"--shape {text}: {name}={value} is outside the spec's dims.{name} = [{lo}, {hi}] "
                             f"(the kernel is verified for those sizes only)")
    return dims


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def results_table(result) -> Table:
    table = Table(title=f"{result.op} on {result.device} (copy roofline {result.copy_gbs:.0f} GB/s)",
                  title_justify="left")
    for column in ("shape", "dtype", "MB", "eager ms", "compile ms", "kernel ms", "kernel GB/s", "of roofline",
                   "vs eager", "vs compile"):
        table.add_column(column, justify="left" if column in ("shape", "dtype") else "right",
                         no_wrap=column == "shape")
    for row in result.rows:
        data = row.as_dict()
        table.add_row(" ".join(f"{k}={v}" for k, v in row.dims.items()), row.dtype, f"{row.bytes / 1e6:.1f}",
                      _fmt(row.eager_us and row.eager_us / 1000, ".4f"),
                      _fmt(row.compile_us and row.compile_us / 1000, ".4f"),
                      _fmt(row.kernel_us and row.kernel_us / 1000, ".4f"), _fmt(data["kernel_gbs"], ".0f"),
                      _fmt(data["kernel_roofline_fraction"], ".0%"), _fmt(data["speedup_vs_eager"], ".2f") + "x",
                      _fmt(data["speedup_vs_compile"], ".2f") + "x")
    return table


def run(args) -> int:
    from . import kernel_argument
    from ..spec import load_spec
    from ..verify import gpu_available

    spec = load_spec(args.spec)
    shapes = [parse_shape(s, spec.signature.symbols(), spec.dims) for s in args.shape] if args.shape else None
    for dtype in args.dtype or []:
        if dtype not in spec.dtypes:
            raise UsageError(f"--dtype {dtype}: the spec's dtypes are {', '.join(spec.dtypes)}")
    if not shapes and not spec.benchmark:
        raise UsageError(f"{args.spec}: the spec has no `benchmark:` shapes; pass --shape N=...,D=...")
    from ..ui import Progress, emit_json, human_console

    progress = Progress()
    library = None
    if args.kernel:
        kernel = kernel_argument(args.kernel)
        from ..abi import write_header
        from ..toolchain import compile_kernel

        from ..toolchain import check_symbols

        compiling = progress.stage(f"compiling {args.kernel}")
        with compiling, tempfile.TemporaryDirectory(prefix="specgen-abi-") as header_dir:
            write_header(spec, header_dir)
            library = compile_kernel(kernel, include_dirs=[Path(header_dir)], arch=args.arch, name=spec.name,
                                     source_name=args.kernel).library
        # the benchmark loads the library: nothing that a kernel may not do gets that far
        if violations := check_symbols(library, spec.libraries):
            raise Rejected(f"{args.kernel}: not timed, the compiled kernel calls what a kernel may not:\n  "
                           + "\n  ".join(violations[:10]))
    if not gpu_available():
        raise EnvironmentMissing("specgen bench needs a CUDA GPU; none is visible")
    from ..bench import DEFAULT_REPS, bench_spec

    console = human_console(args.json)
    with progress.stage(f"timing {spec.name}") as stage:
        result = bench_spec(spec, library, shapes, args.dtype, compiled=not args.no_compile,
                            reps=args.reps or DEFAULT_REPS,
                            on_row=lambda row: stage.update(f"timed {row.direction} {row.dtype} {row.dims}"))
    console.print(results_table(result))
    for row in result.rows:
        for note in row.notes:
            console.print(f"[yellow]note[/] {row.dtype} {row.dims}: {escape(note)}")
    emit_json(args.json, result.as_record())
    if result.rejected:
        console.print("[red]rejected[/]: a timed call's output was wrong or its time beat physics; these "
                      "timings prove nothing:\n  " + "\n  ".join(escape(line[:400]) for line in result.rejected))
        return EXIT_REJECTED
    return EXIT_OK
