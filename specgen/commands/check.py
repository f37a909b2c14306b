"""`specgen check PATH...`: validate specs and run each reference on small CPU inputs."""
from __future__ import annotations

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
    p.add_argument("--json", default=None, metavar="OUT", help="also write the results as JSON to OUT ('-': stdout)")
    p.set_defaults(func=run)


def result_json(result) -> dict:
    spec = result.spec
    return {"path": str(result.path), "ok": result.ok, "op": spec.name if spec else None,
            "signature": str(spec.signature) if spec else None, "dtypes": list(spec.dtypes) if spec else [],
            "reference_runs": result.runs, "error": str(result.error) if result.error else None,
            "exit_code": result.error.exit_code if result.error else 0}


def run(args) -> int:
    from ..checking import check_spec  # imports torch: only when the command runs
    from ..spec import find_spec_files
    from ..ui import Progress, add_name_column, console, emit_json, human_console

    out = human_console(args.json)
    progress = Progress()
    files = find_spec_files(args.paths)
    table = Table(title="specgen check", title_justify="left")
    add_name_column(table, "op", [p.stem for p in files], out)
    table.add_column("spec", overflow="fold")
    table.add_column("signature", overflow="fold")
    table.add_column("dtypes", overflow="fold")
    table.add_column("result", overflow="fold")
    code = EXIT_OK
    errors, results = [], []
    for path in files:
        with progress.stage(f"checking {path}", done=False):
            results.append(check_spec(path, samples=args.samples, seed=args.seed))
    mark_duplicate_ops(results)
    for result in results:
        path = result.path
        if result.ok:
            spec = result.spec
            table.add_row(escape(spec.name), escape(str(path)), escape(str(spec.signature)), ", ".join(spec.dtypes),
                          f"[green]ok[/] ({len(result.runs)} reference runs)")
        else:
            code = max(code, result.error.exit_code)
            errors.append(result.error)
            table.add_row(escape(path.stem), escape(str(path)), "", "", "[red]error[/]")
    out.print(table)
    for error in errors:
        console(stderr=True).print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True)
    if errors:
        out.print(f"{len(errors)} of {len(files)} spec(s) failed")
    emit_json(args.json, {"ok": not errors, "specs": [result_json(r) for r in results]})
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
