"""`specgen check PATH...`: validate specs and run each reference on small CPU inputs."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_OK


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="validate specs and run their references on small CPU inputs",
                              description="Validate spec files (or every *.yaml in the folders given) and run "
                                          "each reference on small random CPU inputs. No GPU needed.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="spec files or folders of specs")
    p.add_argument("--samples", type=int, default=2, help="random shapes per dtype (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..checking import check_spec  # imports torch: only when the command runs
    from ..spec import find_spec_files

    console = Console(highlight=False)
    files = find_spec_files(args.paths)
    table = Table(title="specgen check")
    for column in ("spec", "signature", "dtypes", "result"):
        table.add_column(column, overflow="fold")
    code = EXIT_OK
    errors = []
    for path in files:
        result = check_spec(path, samples=args.samples, seed=args.seed)
        if result.ok:
            spec = result.spec
            table.add_row(str(path), escape(str(spec.signature)), ", ".join(spec.dtypes),
                          f"[green]ok[/] ({len(result.runs)} reference runs)")
        else:
            code = max(code, result.error.exit_code)
            errors.append(result.error)
            table.add_row(str(path), "", "", "[red]error[/]")
    console.print(table)
    for error in errors:
        Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(str(error))}")
    if errors:
        console.print(f"{len(errors)} of {len(files)} spec(s) failed")
    return code if errors else EXIT_OK
