"""The report's charts as inline SVG text, drawn with matplotlib (the `report` extra).

Text stays text in the SVG (searchable, small), ids are salted for byte-stable output.
"""
from __future__ import annotations

import io
import re
import statistics

from ..errors import EnvironmentMissing

COLORS = {"eager": "#9aa5b1", "compile": "#5b8def", "baseline": "#2f9e44", "kernel": "#e8590c"}


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise EnvironmentMissing("specgen report draws its charts with matplotlib, which is not installed; "
                                 "pip install 'specgen[report]'") from None
    matplotlib.use("Agg", force=True)
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "specgen-report",
                                "font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    import matplotlib.pyplot as plt

    return plt


def _svg(fig) -> str:
    plt = _pyplot()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):].strip()


def _label(row: dict) -> str:
    dims = ",".join(f"{k}={v}" for k, v in (row.get("dims") or {}).items())
    direction = {"forward": "fwd", "backward": "bwd"}.get(row["direction"], row["direction"])
    return f"{direction} {row.get('dtype') or ''} {dims}".strip()


def op_times(op: dict) -> str | None:
    """Eager, torch.compile, any baseline kernel and the kernel, per benchmark row (microseconds,
    log scale)."""
    rows = op["benchmark"]["rows"]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.42 * len(rows)))
    names = ["eager", "compile"] + (["baseline"] if any(r.get("baseline_us") for r in rows) else []) + ["kernel"]
    height = 0.78 / len(names)
    for k, name in enumerate(names):
        values = [r.get(f"{name}_us") or 0 for r in rows]
        positions = [i + (k - (len(names) - 1) / 2) * height for i in range(len(rows))]
        ax.barh(positions, values, height=height, color=COLORS[name], label=name if name != "compile"
                else "torch.compile")
    ax.set_yticks(range(len(rows)), [_label(r) for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("time (µs, log scale; shorter is faster)")
    ax.legend(loc="lower right", frameon=False, ncol=len(names))
    ax.set_title(f"{op['op']}: time per call", loc="left")
    return _svg(fig)


def speedups(ops: list[dict]) -> str | None:
    """Per op and direction, the geomean speedup of the kernel over eager and over torch.compile."""
    items = [(f"{op['op']} ({'fwd' if direction == 'forward' else 'bwd'})", s) for op in ops for direction, s in (op.get("summary") or {}).items()
             if s.get("vs_eager") or s.get("vs_compile")]
    if not items:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.36 * len(items)))
    height = 0.38
    for k, (key, name) in enumerate((("vs_eager", "eager"), ("vs_compile", "compile"))):
        ax.barh([i + (k - 0.5) * height for i in range(len(items))], [s.get(key) or 0 for _, s in items],
                height=height, color=COLORS[name], label=f"vs {'torch.compile' if name == 'compile' else name}")
    ax.axvline(1.0, color="#333", linewidth=0.8)
    ax.set_yticks(range(len(items)), [label for label, _ in items])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("kernel speedup (geometric mean over the benchmark rows; > 1: the kernel is faster)")
    ax.legend(loc="lower right", frameon=False)
    ax.set_title("Speedup of the kernels", loc="left")
    return _svg(fig)


def roofline(ops: list[dict]) -> str | None:
    """Achieved bandwidth against bytes moved, under the copy roofline (memory-bound ops)."""
    rows = [(op, r) for op in ops for r in op["benchmark"]["rows"] if r.get("bytes")]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    by_device: dict[str, list[float]] = {}
    for op in {id(op): op for op, _ in rows}.values():
        if op["benchmark"].get("copy_gbs"):
            by_device.setdefault(op["benchmark"].get("device") or "", []).append(op["benchmark"]["copy_gbs"])
    for ceiling in (statistics.median(values) for values in by_device.values()):  # one line per GPU
        ax.axhline(ceiling, color="#333", linestyle="--", linewidth=0.9)
        ax.annotate(f"copy roofline {ceiling:.0f} GB/s", (0.01, ceiling), xycoords=("axes fraction", "data"),
                    textcoords="offset points", xytext=(0, 3), fontsize=8)
    markers = {"eager": "x", "compile": "s", "kernel": "o"}
    for name in ("eager", "compile", "kernel"):
        xs = [r["bytes"] for _, r in rows if r.get(f"{name}_us")]
        ys = [r["bytes"] / (r[f"{name}_us"] * 1e-6) / 1e9 for _, r in rows if r.get(f"{name}_us")]
        ax.scatter(xs, ys, marker=markers[name], s=22 if name == "kernel" else 16, color=COLORS[name],
                   label="torch.compile" if name == "compile" else name, alpha=0.9,
                   facecolors="none" if name == "compile" else None)
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per call (inputs read once, outputs written once)")
    ax.set_ylabel("achieved bandwidth (GB/s)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", frameon=False)
    ax.set_title("Roofline: achieved bandwidth under the device-to-device copy bandwidth", loc="left")
    return _svg(fig)


def history(points: list[dict]) -> str | None:
    """Geomean speedup over torch.compile of each op's forward, across lock commits."""
    if len(points) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ops = sorted({op for p in points for op in p["ops"]})
    for op in ops:
        xs, ys = [], []
        for index, point in enumerate(points):
            value = ((point["ops"].get(op) or {}).get("forward") or {}).get("vs_compile")
            if value:
                xs.append(index)
                ys.append(value)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label=op)
    ax.axhline(1.0, color="#333", linewidth=0.8)
    ax.set_xticks(range(len(points)), [f"{p['date'][:10]}\n{p['commit'][:7]}" for p in points], fontsize=7)
    ax.set_ylabel("forward speedup vs torch.compile")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=8)
    ax.set_title("History across lock updates", loc="left")
    return _svg(fig)


def sanitize_ids(svg: str, prefix: str) -> str:
    """Make the ids of one SVG unique in a page holding several (matplotlib reuses clip ids)."""
    ids = set(re.findall(r'id="([^"]+)"', svg))
    for name in sorted(ids, key=len, reverse=True):
        svg = svg.replace(f'id="{name}"', f'id="{prefix}-{name}"').replace(f"#{name})", f"#{prefix}-{name})") \
            .replace(f'"#{name}"', f'"#{prefix}-{name}"')
    return svg
