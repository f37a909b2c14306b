"""`specgen report [SPECS...] -o report.html`: what the lock says, as one HTML file (and JSON)."""
from __future__ import annotations

import os
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_OK


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="an HTML report (SVG charts) of the lock's verification and benchmark records",
        description="Read specgen.lock in each spec folder (and `specgen bench --json` files with --bench): per op "
                    "and direction the time of eager PyTorch, torch.compile and the kernel, the speedups, the "
                    "fraction of the copy roofline on a roofline chart, the verification (cases, dtypes, "
                    "tolerances, sanitized or not) and the history across the lock's git commits. Writes one "
                    "self-contained HTML file; --json - prints the same data on stdout.")
    p.add_argument("specs", nargs="*", default=["specs"], metavar="SPECS",
                   help="spec folders or spec files (default specs/)")
    p.add_argument("-o", "--out", default="report.html", metavar="FILE", help="the HTML file (default report.html)")
    p.add_argument("--bench", action="append", default=[], metavar="FILE.json",
                   help="a record written by `specgen bench --json FILE` (repeatable)")
    p.add_argument("--no-history", action="store_true", help="skip the lock's git history")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the data as JSON to OUT ('-': stdout)")
    p.set_defaults(func=run)


def summary_table(data: dict, out) -> Table:
    from ..ui import add_name_column

    table = Table(title="specgen report", title_justify="left")
    add_name_column(table, "op", [op["op"] for op in data["ops"]], out)
    for column in ("path", "verified", "direction", "vs eager", "vs compile", "of roofline"):
        table.add_column(column, justify="left" if column in ("path", "verified", "direction") else "right")
    for op in data["ops"]:
        verified = op["verification"]["gpu_arch"] if op["verified"] else ("no" if op["path"] == "kernel" else "–")
        rows = list((op.get("summary") or {}).items()) or [("–", {})]
        for index, (direction, s) in enumerate(rows):
            table.add_row(escape(op["op"]) if index == 0 else "", op["path"] if index == 0 else "",
                          verified if index == 0 else "", direction,
                          *(f"{s[k]:.2f}x" if s.get(k) else "–" for k in ("vs_eager", "vs_compile")),
                          f"{s['roofline']:.0%}" if s.get("roofline") is not None else "–")
    return table


def run(args) -> int:
    from ..fsutil import write_atomic
    from ..report import build_report
    from ..ui import Progress, emit_json, human_console

    progress = Progress()
    with progress.stage("collecting the lock's records" + ("" if args.no_history else " and its history")):
        data, html = build_report(args.specs, bench_files=args.bench, history=not args.no_history)
    out = Path(args.out)
    write_atomic(out, html)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out, 0o666 & ~umask)  # a report is for sharing (write_atomic's temporary file is 0600)
    human = human_console(args.json)
    human.print(summary_table(data, human))
    human.print(f"[green]wrote[/] {escape(str(out))} ({len(html) / 1024:.0f} KiB, self-contained)", soft_wrap=True)
    emit_json(args.json, data)
    return EXIT_OK
