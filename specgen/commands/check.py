"""`specgen check PATH...`: validate specs and run each reference on small CPU inputs."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_OK
from . import positive_int, seed_int


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="validate specs and run their references on small CPU inputs",
                              description="Validate spec files (or every *.yaml in the folders given) and run "
                                          "each reference on small random CPU inputs. No GPU needed.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="spec files or folders of specs")
    p.add_argument("--samples", type=positive_int, default=2, help="random shapes per dtype (default 2)")
    p.add_argument("--seed", type=seed_int, default=0)
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
    results = [check_spec(path, samples=args.samples, seed=args.seed) for path in files]
    mark_duplicate_ops(results)
    for result in results:
        path = result.path
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
        Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True)
    if errors:
        console.print(f"{len(errors)} of {len(files)} spec(s) failed")
    return code if errors else EXIT_OK


def mark_duplicate_ops(results) -> None:
    """Two files defining one op (up to case), or an op named like another's backward op: an
    error on the later file, at its `name:`."""
    from ..errors import Location, SpecError
    from ..yamlpos import load_yaml_with_positions

    ok = [r for r in results if r.ok]
    by_name = {r.spec.name: r for r in reversed(ok)}  # the first file of each name
    seen: dict[str, object] = {}
    for result in ok:
        name = result.spec.name
        other = seen.setdefault(name.lower(), result)
        problem = None
        if other is not result:
            problem = (f"the op {name!r} is also defined in {other.path}" if other.spec.name == name else
                       f"the ops {other.spec.name!r} ({other.path}) and {name!r} differ only in case: their "
                       f"files and header guards collide")
        elif name.endswith("_backward") and name[:-len("_backward")] in by_name:
            base = by_name[name[:-len("_backward")]]
            if base.spec.backward != "none":
                problem = f"the op {name!r} collides with the backward op of {base.spec.name!r} ({base.path})"
        if problem:
            try:
                location = load_yaml_with_positions(result.path)[1].location(("name",))
            except SpecError:
                location = Location(result.path)
            result.error = SpecError(problem, location=location, field="name",
                                     hint="op names must be unique (up to case) in a folder of specs: rename one")
