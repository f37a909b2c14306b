"""The report as one self-contained HTML file: inline CSS, charts as inline SVG, no scripts,
no links out. Rendered from templates/report/report.html.j2."""
from __future__ import annotations

from pathlib import Path

import jinja2
from markupsafe import Markup

from . import charts


def _template_dir() -> Path:
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "templates" / "report", package.parent / "templates" / "report"):
        if (folder / "report.html.j2").is_file():
            return folder
    raise FileNotFoundError(f"the report template is missing from {package}; reinstall specgen")


def _missing(value) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


def _num(value, digits: int = 1) -> str:
    return "–" if _missing(value) else f"{value:,.{digits}f}"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_template_dir())), autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    env.filters["times"] = lambda v: "–" if _missing(v) else f"{v:.2f}×"
    env.filters["percent"] = lambda v: "–" if _missing(v) else f"{v:.0%}"
    env.filters["sci"] = lambda v: "–" if _missing(v) else f"{v:.3g}"
    env.filters["dims"] = lambda d: ", ".join(f"{k}={v}" for k, v in (d or {}).items())
    return env


def render_html(data: dict) -> str:
    figures = {"speedups": charts.speedups(data["ops"]), "roofline": charts.roofline(data["ops"]),
               "history": charts.history(data["history"])}
    op_figures = {op["op"]: charts.op_times(op) for op in data["ops"]}
    safe = {key: Markup(charts.sanitize_ids(svg, key)) if svg else None for key, svg in figures.items()}
    op_safe = {key: Markup(charts.sanitize_ids(svg, f"op-{i}")) if svg else None
               for i, (key, svg) in enumerate(op_figures.items())}
    return environment().get_template("report.html.j2").render(data=data, figures=safe, op_figures=op_safe)
