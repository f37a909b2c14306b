"""`specgen import PATH.py:NAME [-o specs/]`: a spec from a function or an nn.Module class.

The target runs on its example inputs (the module's `get_inputs()`, or `--inputs FUNC`) and
on other shapes, to find the symbolic sizes; the spec is checked (`specgen check`) before it
is written, atomically, and never over an existing file without --force. The guesses to
confirm are printed and written as comments at the top of the spec.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rich.markup import escape

from ..errors import EXIT_OK, Rejected, UsageError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import", help="write a spec from a Python function or nn.Module (e.g. a KernelBench file)",
        description="Write a spec from TARGET: PATH.py:NAME (a function or an nn.Module class), PATH.py (the "
                    "KernelBench convention: Model, get_inputs, get_init_inputs) or package.module:NAME. Symbolic "
                    "sizes, dtypes, dims ranges, integer value ranges, scalars and benchmark shapes come from the "
                    "example inputs; sizes that were equal by chance are flagged, not silently merged. A module's "
                    "parameters and buffers become inputs of the spec. The spec is checked before it is written.")
    p.add_argument("target", metavar="TARGET", help="PATH.py:NAME, PATH.py or package.module:NAME")
    p.add_argument("-o", "--out", default="specs", metavar="DIR_OR_FILE",
                   help="a folder (the spec is NAME.yaml in it) or a .yaml path (default specs/)")
    p.add_argument("--name", default=None, help="the op name (default: from the function, class or file)")
    p.add_argument("--reference", choices=("auto", "inline", "import"), default="auto",
                   help="inline: copy the module's source into the spec; import: reference it by path "
                        "(module:NAME), so model code is not copied; auto (default): import for "
                        "package.module:NAME, inline for a file")
    p.add_argument("--inputs", default=None, metavar="FUNC",
                   help="the function of the module giving example inputs (default get_inputs)")
    p.add_argument("--init-inputs", default=None, metavar="FUNC",
                   help="the function giving an nn.Module's constructor arguments (default get_init_inputs)")
    p.add_argument("--dtypes", default=None, metavar="LIST",
                   help="working dtypes, e.g. float32,bfloat16 (default: the example's, plus float16 and "
                        "bfloat16 where the reference runs in them)")
    p.add_argument("--backward", choices=("kernel", "reference", "none"), default=None,
                   help="default: kernel when the reference is differentiable, else none")
    p.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON to OUT ('-': stdout)")
    p.set_defaults(func=run)


def destination(out: str, name: str) -> Path:
    path = Path(out)
    return path if path.suffix in (".yaml", ".yml") else path / f"{name}.yaml"


def checked_write(path: Path, text: str, *, force: bool) -> None:
    """Check the spec where it will live (its folder matters to an import-path reference),
    then move it into place: a spec that fails `specgen check` is never written."""
    from ..checking import check_spec
    from ..fsutil import write_atomic

    if path.exists() and not force:
        raise UsageError(f"{path} exists already; pass --force to overwrite it, or -o another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".yaml", dir=path.parent)
    os.close(fd)
    try:
        Path(tmp).write_text(text, encoding="utf-8")
        result = check_spec(Path(tmp))
        if not result.ok:
            message = str(result.error).replace(tmp, str(path))
            raise Rejected(f"the spec written for {path.name} fails `specgen check`, so it was not written:\n"
                           f"  {message}")
        write_atomic(path, text)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def run(args) -> int:
    from ..importing import import_target
    from ..ui import Progress, emit_json, human_console

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] if args.dtypes else None
    out = human_console(args.json)
    progress = Progress()
    if (args.name or Path(args.out).suffix in (".yaml", ".yml")) and not args.force:
        early = destination(args.out, args.name or "")
        if early.exists():  # say so before running the model
            raise UsageError(f"{early} exists already; pass --force to overwrite it, or -o another path")
    with progress.stage(f"importing {args.target}"):
        imported = import_target(args.target, inputs=args.inputs, init_inputs=args.init_inputs, name=args.name,
                                 reference=args.reference, dtypes=dtypes, backward=args.backward)
    path = destination(args.out, imported.name)
    with progress.stage(f"checking the spec {path}"):
        checked_write(path, imported.text(), force=args.force)
    out.print(f"[green]wrote[/] {escape(str(path))}: {escape(imported.signature)}", soft_wrap=True)
    if imported.flags:
        out.print(f"[yellow]confirm[/] ({len(imported.flags)}; also written as comments at the top of the spec):")
        for flag in imported.flags:
            out.print(f"  - {escape(flag)}", soft_wrap=True)
    out.print(f"next: review {escape(str(path))}, then `specgen build {escape(str(path.parent))}`", soft_wrap=True)
    emit_json(args.json, {"path": str(path), **imported.as_json()})
    return EXIT_OK
