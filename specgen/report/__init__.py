"""`specgen report`: the lock's verification and benchmark records (and extra `specgen bench`
records, and the lock's git history) as one self-contained HTML file with SVG charts, and
the same data as JSON. `data` collects, `history` reads git, `charts` draws, `html` renders."""
from __future__ import annotations

from .data import collect


def build_report(paths, *, bench_files=(), history: bool = True) -> tuple[dict, str]:
    from .html import render_html

    data = collect(paths, bench_files=bench_files, history=history)
    return data, render_html(data)


__all__ = ["build_report", "collect"]
