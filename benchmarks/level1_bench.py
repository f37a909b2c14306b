"""The level-1 suite on the GPU: the built-in generator as a user meets it, beside eager
PyTorch and torch.compile, against the targets of issue #12.

    python benchmarks/level1_bench.py [--specs benchmarks/level1/specs] [--out DIR]
        [--only relu,softmax_wide] [--sizes decode|large|all] [--budget-s 540] [--spec-budget-s 150]
        [--directions forward|all] [--tune auto|on|off] [--examples N] [--shard K/N]
    python benchmarks/level1_bench.py --merge A.json B.json [--out DIR]     # several runs, one table
    python benchmarks/level1_bench.py --plan [--sizes large]     # CPU: lowering, rows, memory, no GPU

For a folder of specs (`# family: NAME` on each file's first line groups them):

1. lowering, for every spec first (CPU, seconds): `build_source(spec)`, the code `specgen
   generate --agent builtin` runs first; a refusal is a problem row with its message;
2. then spec by spec while the budget lasts: `generate_builtin(spec, gpu=True, write=False)`
   (compile, verify; autotune when the user's path does, see --tune): nothing is written
   next to the specs, no lock is touched. Today `specgen generate --agent builtin` asks
   `BuiltinAgent` for the default variant (`build_source(spec)`) and verifies it with the
   same verifier: `generate_builtin(tune=False)` compiles and verifies that same source.
   Once `specgen generate` autotunes (a `--tune...` option), `--tune auto` follows it;
3. every benchmark row (shape x dtype x direction; backward where the spec asks for a
   kernel) timed by `specgen.bench.bench_spec`, the one timing method (eager, a fresh
   torch.compile per row, the kernel in its own process, L2 flushed, median of REPS);
4. per row: kernel/eager and kernel/compile as speedups (eager_us / kernel_us: 0.96 means 4%
   slower), the kernel's bandwidth (bytes of the signature / time) as a fraction of what aten's
   own `x.neg()` reaches in this run (measured once per dtype) and of the HBM peak
   (specgen/verify/physics.py).

Targets (issue #12), checked per row and summed up:
- every row >= 0.97x eager;
- >= 0.97x torch.compile on >= 90% of the rows (rows whose compiled reference fell back to
  eager are left out of this count, and say so);
- pointwise and last-axis reduction rows whose largest tensor is >= 1 GB: >= 98% of the
  `x.neg()` bandwidth;
- >= 90% of the problems lowered, every lowered problem verified.

Robust by construction: a spec that fails to load, refuses, fails verification or crashes
while timed is a row, never an abort; past the total budget (--budget-s) every remaining spec
is a "not reached" row, past a spec's budget its remaining rows are. The JSON (rows, problems,
summary, environment) and the markdown table are rewritten after every spec, so a timeout
still leaves everything measured so far. Rows with a largest tensor >= 1 GB are timed with
one input set (the L2 is flushed before every call anyway; three sets of 6 GB tensors would
not fit beside eager and compile).
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_SPECS = REPO / "benchmarks" / "level1" / "specs"
TARGET_EAGER = 0.97  # every row: kernel at least 0.97x eager
TARGET_COMPILE = 0.97  # per row ...
TARGET_COMPILE_SHARE = 0.90  # ... on at least 90% of the rows
TARGET_NEG_FRACTION = 0.98  # of the x.neg() bandwidth, pointwise / last-axis reductions >= 1 GB
TARGET_LOWERED = 0.90  # of the problems
LARGE_BYTES = 1e9  # a row's largest tensor at least this: the bandwidth target applies
DECODE_BYTES = 64 << 20  # a shape whose largest float32 tensor is under this is a decode size
BANDWIDTH_FAMILIES = ("pointwise", "reduce_last")
NEG_BYTES = 1 << 31  # the x.neg() bandwidth probe: a 2 GiB input per dtype
REPS = 30
MEMORY_SHARE = 0.8  # a row whose estimated footprint exceeds this share of the GPU is skipped

# row statuses
TIMED, REFUSED, UNVERIFIED, ERROR, NOT_REACHED, SKIPPED = (
    "timed", "refused", "not verified", "error", "not reached", "skipped")


# ------------------------------------------------------------------ specs, shapes, sizes (CPU)

def spec_family(path: Path) -> str:
    """The `# family: NAME` comment at the top of a spec file ('other' without one)."""
    try:
        for line in Path(path).read_text().splitlines()[:5]:
            match = re.match(r"#\s*family:\s*([\w-]+)", line)
            if match:
                return match.group(1)
    except OSError:
        pass
    return "other"


def find_specs(folders: list[Path], only: list[str] | None = None, shard: tuple[int, int] | None = None,
               skip: set[str] | frozenset = frozenset()) -> list[Path]:
    """The specs to run, sorted by name; `shard` (K, N) keeps every N-th from the K-th (of the
    whole folder, so a shard names the same specs in every call); `skip`: names left out (the
    problems an earlier call of the shard reached, --skip-reached)."""
    paths = sorted(p for folder in folders for p in Path(folder).glob("*.yaml"))
    if only:
        wanted = set(only)
        paths = [p for p in paths if p.stem in wanted]
    if shard:
        k, n = shard
        paths = [p for i, p in enumerate(paths) if i % n == k - 1]
    return [p for p in paths if str(p.resolve()) not in skip and p.stem not in skip]


def reached_names(files: list[str]) -> set[str]:
    """Problems an earlier run's JSON reached and need not run again: a call that goes on with a
    shard skips them, and --merge joins the two reports. Each is named by its spec file's
    absolute path where the JSON records one (a name alone could match a spec of another set),
    else by its name. Errors are run again (a CUDA context poisoned by an earlier spec makes
    the later ones errors), as are problems not reached."""
    done = set()
    for f in files:
        report = json.loads(Path(f).read_text())
        for p in report.get("problems", []):
            if p.get("status") in (NOT_REACHED, ERROR, None):
                continue
            done.add(str(Path(p["path"]).resolve()) if p.get("path") else p["name"])
    return done


def run_order(paths: list[Path], lowering: dict) -> list[Path]:
    """The order specs are run in: refused ones first (they cost no GPU time), then the others
    round-robin over families, so a run cut by its budget has still sampled every family."""
    refused = [p for p in paths if lowering.get(p.stem) is False]
    by_family: dict[str, list[Path]] = {}
    for p in paths:
        if lowering.get(p.stem) is not False:
            by_family.setdefault(spec_family(p), []).append(p)
    queues = [by_family[f] for f in sorted(by_family)]
    ordered = []
    while any(queues):
        for q in queues:
            if q:
                ordered.append(q.pop(0))
    return refused + ordered


def _itemsize(dtype: str) -> int:
    return {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1}[dtype]


def tensor_sizes(spec, dims: dict, dtype: str) -> list[int]:
    """Bytes of every tensor of the signature (inputs and outputs) at one shape and dtype."""
    sig = spec.signature
    out = []
    for t in [p.type for p in sig.inputs if p.is_tensor] + [o.type for o in sig.outputs]:
        out.append(math.prod(t.shape(dims)) * _itemsize(t.dtype_for(dtype)))
    return out


def size_class(spec, dims: dict) -> str:
    """'decode' or 'large' for a benchmark shape, from its largest tensor in float32."""
    return "large" if max(tensor_sizes(spec, dims, "float32"), default=0) >= DECODE_BYTES else "decode"


def select_shapes(spec, sizes: str) -> list[dict]:
    shapes = [dict(s) for s in spec.benchmark]
    return shapes if sizes == "all" else [s for s in shapes if size_class(spec, s) == sizes]


def shape_text(dims: dict | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (dims or {}).items())


# ------------------------------------------------------------------ one row's targets (CPU, unit-tested)

def evaluate_row(row: dict, neg_gbs: dict, hbm_gbs: float | None) -> dict:
    """Fill in a timed row's ratios and target verdicts (None: the target does not apply).

    In: kernel_us, eager_us, compile_us, compile_fallback, bytes, largest_bytes, dtype, family.
    Out: x_eager / x_compile (speedups: eager_us / kernel_us), kernel_gbs, neg_fraction,
    hbm_fraction, and meets = {eager, compile, bandwidth}, misses (text)."""
    k = row.get("kernel_us")
    e, c = row.get("eager_us"), row.get("compile_us")
    row["x_eager"] = e / k if k and e else None
    row["x_compile"] = c / k if k and c else None
    row["kernel_gbs"] = row["bytes"] / (k * 1e-6) / 1e9 if k and row.get("bytes") else None
    neg = neg_gbs.get(row.get("dtype")) if neg_gbs else None
    big = (row.get("largest_bytes") or 0) >= LARGE_BYTES
    row["neg_gbs"] = neg
    row["neg_fraction"] = row["kernel_gbs"] / neg if row["kernel_gbs"] and neg and big else None
    row["hbm_fraction"] = row["kernel_gbs"] / hbm_gbs if row["kernel_gbs"] and hbm_gbs else None
    meets = {"eager": None, "compile": None, "bandwidth": None}
    misses = []
    if row.get("status") == TIMED and k:
        if row["x_eager"] is not None:
            meets["eager"] = row["x_eager"] >= TARGET_EAGER
            if not meets["eager"]:
                misses.append(f"{row['x_eager']:.2f}x eager < {TARGET_EAGER}")
        else:
            misses.append("no eager time")
        if row["x_compile"] is not None and not row.get("compile_fallback"):
            meets["compile"] = row["x_compile"] >= TARGET_COMPILE
            if not meets["compile"]:
                misses.append(f"{row['x_compile']:.2f}x compile < {TARGET_COMPILE}")
        elif row.get("compile_fallback"):
            misses.append("compile fell back to eager (not counted)")
        if row.get("family") in BANDWIDTH_FAMILIES and big:
            if row["neg_fraction"] is not None:
                meets["bandwidth"] = row["neg_fraction"] >= TARGET_NEG_FRACTION
                if not meets["bandwidth"]:
                    misses.append(f"{100 * row['neg_fraction']:.1f}% of neg() bw < {100 * TARGET_NEG_FRACTION:.0f}%")
            else:
                misses.append("no neg() bandwidth for this dtype")
    elif row.get("status") == TIMED:
        meets["eager"] = False
        misses.append("no kernel time")
    row["meets"] = meets
    row["misses"] = misses
    return row


def _share(hits: int, total: int) -> float | None:
    return hits / total if total else None


def summarize(problems: list[dict], rows: list[dict]) -> dict:
    """The targets over a run: problems lowered and verified, rows at the eager and compile
    targets, bandwidth rows at the neg() target; per family counts; overall pass/fail."""
    n = len(problems)
    lowered = [p for p in problems if p.get("lowered")]
    reached = [p for p in lowered if p.get("verified") is not None]
    verified = [p for p in lowered if p.get("verified")]
    timed = [r for r in rows if r.get("status") == TIMED]
    eager = [r["meets"]["eager"] for r in timed if r["meets"]["eager"] is not None]
    compiled = [r["meets"]["compile"] for r in timed if r["meets"]["compile"] is not None]
    bandwidth = [r["meets"]["bandwidth"] for r in timed if r["meets"]["bandwidth"] is not None]
    lowered_share = _share(len(lowered), n)
    compile_share = _share(sum(compiled), len(compiled))
    targets = {
        "lowered": {"value": lowered_share, "target": TARGET_LOWERED,
                    "ok": lowered_share is not None and lowered_share >= TARGET_LOWERED,
                    "text": f"{len(lowered)}/{n} problems lowered"},
        "verified": {"value": _share(len(verified), len(reached)), "target": 1.0,
                     "ok": len(verified) == len(reached) and bool(reached),
                     "text": f"{len(verified)}/{len(reached)} lowered problems reached were verified"
                             + (f" ({len(lowered) - len(reached)} lowered not reached)" if len(reached) < len(lowered)
                                else "")},
        "eager": {"value": _share(sum(eager), len(eager)), "target": 1.0, "ok": bool(eager) and all(eager),
                  "text": f"{sum(eager)}/{len(eager)} rows >= {TARGET_EAGER}x eager (target: every row)"},
        "compile": {"value": compile_share, "target": TARGET_COMPILE_SHARE,
                    "ok": compile_share is not None and compile_share >= TARGET_COMPILE_SHARE,
                    "text": f"{sum(compiled)}/{len(compiled)} rows >= {TARGET_COMPILE}x torch.compile "
                            f"(target: {100 * TARGET_COMPILE_SHARE:.0f}% of rows)"},
        "bandwidth": {"value": _share(sum(bandwidth), len(bandwidth)), "target": 1.0,
                      "ok": all(bandwidth) if bandwidth else None,
                      "text": f"{sum(bandwidth)}/{len(bandwidth)} pointwise/last-axis rows >= 1 GB at >= "
                              f"{100 * TARGET_NEG_FRACTION:.0f}% of the neg() bandwidth"},
    }
    families: dict[str, dict] = {}
    for p in problems:
        f = families.setdefault(p.get("family", "other"), {"problems": 0, "lowered": 0, "verified": 0, "rows": 0,
                                                           "eager_ok": 0, "compile_ok": 0, "compile_rows": 0})
        f["problems"] += 1
        f["lowered"] += bool(p.get("lowered"))
        f["verified"] += bool(p.get("verified"))
    for r in timed:
        f = families.setdefault(r.get("family", "other"), {"problems": 0, "lowered": 0, "verified": 0, "rows": 0,
                                                           "eager_ok": 0, "compile_ok": 0, "compile_rows": 0})
        f["rows"] += 1
        f["eager_ok"] += bool(r["meets"]["eager"])
        f["compile_ok"] += bool(r["meets"]["compile"])
        f["compile_rows"] += r["meets"]["compile"] is not None
    ratios = [r["x_compile"] for r in timed if r.get("x_compile") and not r.get("compile_fallback")]
    return {
        "problems": n, "lowered": len(lowered), "refused": sum(1 for p in problems if p.get("status") == REFUSED),
        "verified": len(verified), "not_reached": sum(1 for p in problems if p.get("status") == NOT_REACHED),
        "errors": sum(1 for p in problems if p.get("status") == ERROR),
        "rows_timed": len(timed), "rows_not_reached": sum(1 for r in rows if r.get("status") == NOT_REACHED),
        "rows_skipped": sum(1 for r in rows if r.get("status") == SKIPPED),
        "rows_error": sum(1 for r in rows if r.get("status") == ERROR),
        "verified_without_some_shapes": sum(1 for p in problems if p.get("verify_dropped_shapes")),
        "geomean_x_compile": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
        "targets": targets,
        "all_targets_met": all(t["ok"] is not False for t in targets.values()) and not any(
            p.get("status") == NOT_REACHED for p in problems),
        "families": families,
    }


# ------------------------------------------------------------------ output

def _fmt(value, spec: str = ".1f", empty: str = "-") -> str:
    return empty if value is None else format(value, spec)


def training_steps(rows: list[dict]) -> None:
    """Each timed backward row with its forward row (same shape and dtype) as one training step:
    `step_*_us` = forward + backward, where the baselines' forward is the one recording the graph
    (`*_graph_us`: it saves what their backward reads, so their backward alone can move fewer
    bytes than the inputs: torch.compile saves a hinge loss's mask, not the int64 labels) and the
    kernel's is its plain forward (its backward reads the inputs). `x_*_step` are the ratios.
    Information beside the per-direction targets, which stay as the issue states them."""
    forwards = {(shape_text(r.get("dims")), r.get("dtype")): r for r in rows
                if r.get("direction") == "forward" and r.get("status") == TIMED}
    total = lambda a, b: a + b if a and b else None  # noqa: E731
    for r in rows:
        f = forwards.get((shape_text(r.get("dims")), r.get("dtype")))
        if r.get("direction") != "backward" or r.get("status") != TIMED or f is None:
            continue
        r["step_kernel_us"] = total(f.get("kernel_us"), r.get("kernel_us"))
        r["step_eager_us"] = total(r.get("eager_graph_us"), r.get("eager_us"))
        r["step_compile_us"] = total(r.get("compile_graph_us"), r.get("compile_us"))
        k = r["step_kernel_us"]
        r["x_eager_step"] = r["step_eager_us"] / k if k and r["step_eager_us"] else None
        r["x_compile_step"] = r["step_compile_us"] / k if k and r["step_compile_us"] else None


def target_text(row: dict) -> str:
    if row.get("status") != TIMED:
        return f"{row.get('status', '?').upper()}" + (f": {row['message']}" if row.get("message") else "")
    return "ok" if not row.get("misses") else "MISS: " + "; ".join(row["misses"])


def markdown(report: dict) -> str:
    s = report["summary"]
    env = report.get("environment", {})
    lines = [f"# level-1 suite: {report.get('specs_folder')}", "",
             f"{env.get('gpu')} | torch {env.get('torch')} | commit {env.get('commit')} | "
             f"copy {_fmt(env.get('copy_gbs'), '.0f')} GB/s | HBM peak {_fmt(env.get('hbm_peak_gbs'), '.0f')} GB/s | "
             "neg() " + ", ".join(f"{d} {g:.0f} GB/s" for d, g in (env.get("neg_gbs") or {}).items()), "",
             "| problem | family | lowered | verified | variant | s | note |", "|---|---|---|---|---|---|---|"]
    for p in report["problems"]:
        note = (p.get("message") or p.get("verify_note") or "").replace("|", "/").replace("\n", " ")[:240]
        lines.append(f"| {p['name']} | {p.get('family')} | {'yes' if p.get('lowered') else 'no'} | "
                     f"{ {True: 'yes', False: 'NO', None: '-'}[p.get('verified')] } | {p.get('variant') or '-'} | "
                     f"{_fmt(p.get('seconds'))} | {note} |")
    lines += ["", "| problem | dir | shape | dtype | GB | kernel us | eager us | compile us | x eager | x compile | "
                  "% neg bw | % HBM | target |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['name']} | {r.get('direction') or '-'} | {shape_text(r.get('dims'))} | {r.get('dtype') or '-'} | "
                     f"{_fmt((r.get('bytes') or 0) / 1e9 if r.get('bytes') else None, '.2f')} | "
                     f"{_fmt(r.get('kernel_us'))} | {_fmt(r.get('eager_us'))} | {_fmt(r.get('compile_us'))} | "
                     f"{_fmt(r.get('x_eager'), '.2f')} | {_fmt(r.get('x_compile'), '.2f')} | "
                     f"{_fmt(100 * r['neg_fraction'] if r.get('neg_fraction') else None, '.1f')} | "
                     f"{_fmt(100 * r['hbm_fraction'] if r.get('hbm_fraction') else None, '.0f')} | "
                     f"{target_text(r).replace('|', '/')[:200]} |")
    steps = [r for r in report["rows"] if r.get("step_kernel_us")]
    if steps:
        lines += ["", "training steps (forward + backward; the baselines' forward records the graph and saves what "
                      "their backward reads):", "",
                  "| problem | shape | dtype | kernel us | eager us | compile us | x eager | x compile |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['name']} | {shape_text(r.get('dims'))} | {r.get('dtype')} | {_fmt(r.get('step_kernel_us'))} | "
                  f"{_fmt(r.get('step_eager_us'))} | {_fmt(r.get('step_compile_us'))} | "
                  f"{_fmt(r.get('x_eager_step'), '.2f')} | {_fmt(r.get('x_compile_step'), '.2f')} |" for r in steps]
    lines += ["", "## targets", ""]
    for name, t in s["targets"].items():
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[t["ok"]]
        lines.append(f"- {name}: {verdict}: {t['text']}")
    if s.get("geomean_x_compile"):
        lines.append(f"- geometric mean vs torch.compile: {s['geomean_x_compile']:.2f}x")
    lines += ["", "| family | problems | lowered | verified | rows | >= eager | >= compile |", "|---|---|---|---|---|---|---|"]
    for name, f in sorted(s["families"].items()):
        lines.append(f"| {name} | {f['problems']} | {f['lowered']} | {f['verified']} | {f['rows']} | "
                     f"{f['eager_ok']}/{f['rows']} | {f['compile_ok']}/{f['compile_rows']} |")
    return "\n".join(lines) + "\n"


def print_tables(report: dict, summary_only: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(160, int(os.environ.get("COLUMNS", "0") or 0)))
    s = report["summary"]
    if not summary_only:
        problems = Table(title=f"problems: {report.get('specs_folder')}", show_lines=False)
        for col in ("problem", "family", "lowered", "verified", "variant", "s", "note"):
            problems.add_column(col, overflow="fold")
        for p in report["problems"]:
            problems.add_row(p["name"], p.get("family", ""), "yes" if p.get("lowered") else "[red]no[/]",
                             {True: "yes", False: "[red]NO[/]", None: "-"}[p.get("verified")], p.get("variant") or "-",
                             _fmt(p.get("seconds")), (p.get("message") or p.get("verify_note") or "")[:240])
        console.print(problems)
        rows = Table(title="rows (x eager / x compile: eager_us / kernel_us; % neg bw: rows whose largest tensor >= 1 GB)")
        for col in ("problem", "dir", "shape", "dtype", "GB", "kernel us", "eager us", "compile us", "x eager",
                    "x compile", "% neg", "% HBM", "target"):
            rows.add_column(col, overflow="fold")
        for r in report["rows"]:
            text = target_text(r)
            style = "green" if text == "ok" else "red" if text.startswith("MISS") else "yellow"
            rows.add_row(r["name"], {"forward": "fwd", "backward": "bwd"}.get(r.get("direction"), "-"), shape_text(r.get("dims")), r.get("dtype") or "-",
                         _fmt((r.get("bytes") or 0) / 1e9 if r.get("bytes") else None, ".2f"),
                         _fmt(r.get("kernel_us")), _fmt(r.get("eager_us")), _fmt(r.get("compile_us")),
                         _fmt(r.get("x_eager"), ".2f"), _fmt(r.get("x_compile"), ".2f"),
                         _fmt(100 * r["neg_fraction"] if r.get("neg_fraction") else None, ".1f"),
                         _fmt(100 * r["hbm_fraction"] if r.get("hbm_fraction") else None, ".0f"),
                         f"[{style}]{text[:160]}[/]")
        console.print(rows)
    fam = Table(title="per family")
    for col in ("family", "problems", "lowered", "verified", "rows", ">= eager", ">= compile"):
        fam.add_column(col)
    for name, f in sorted(s["families"].items()):
        fam.add_row(name, str(f["problems"]), str(f["lowered"]), str(f["verified"]), str(f["rows"]),
                    f"{f['eager_ok']}/{f['rows']}", f"{f['compile_ok']}/{f['compile_rows']}")
    console.print(fam)
    targets = Table(title=f"targets ({report.get('specs_folder')})")
    for col in ("target", "verdict", "measured"):
        targets.add_column(col)
    for name, t in s["targets"].items():
        verdict = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "n/a"}[t["ok"]]
        targets.add_row(name, verdict, t["text"])
    if s.get("geomean_x_compile"):
        targets.add_row("geomean", "", f"{s['geomean_x_compile']:.2f}x torch.compile over the timed rows")
    targets.add_row("coverage", "", f"{s['rows_timed']} rows timed, {s['rows_not_reached']} not reached, "
                                    f"{s['rows_skipped']} skipped, {s['rows_error']} errors; "
                                    f"{s['not_reached']} problems not reached; "
                                    f"{s.get('verified_without_some_shapes', 0)} verified without their largest "
                                    f"shape(s) (memory: see the problem notes)")
    console.print(targets)


def write_report(out: Path, report: dict, name: str = "level1_bench") -> None:
    from specgen.fsutil import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.json", json.dumps(report, indent=2, default=str))
    write_atomic(out / f"{name}.md", markdown(report))


# ------------------------------------------------------------------ environment and probes (GPU)

def git_commit() -> str:
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (head + ("+dirty" if dirty else "")) if head else "unknown"
    except Exception:  # noqa: BLE001 - no git on the GPU machine: the commit is unknown
        return "unknown"


def neg_bandwidth_gbs(dtype: str, nbytes: int = NEG_BYTES) -> float:
    """What aten's own elementwise kernel reaches: `x.neg()` on a 2 GiB input, bytes read +
    written per second, timed as bench.py times everything (events, L2 flushed, median)."""
    import torch

    from specgen.bench import time_callable
    from specgen.inputs import TORCH_DTYPES

    torch_dtype = TORCH_DTYPES[dtype]
    held = [torch.randn(nbytes // torch.empty((), dtype=torch_dtype).element_size(), device="cuda", dtype=torch_dtype)]
    stats = time_callable(lambda: held[0].neg(), warmup=5, reps=30)
    held.clear()
    torch.cuda.empty_cache()
    return 2 * nbytes / (stats.median_ms * 1e-3) / 1e9


def environment(dtypes: list[str]) -> dict:
    import torch

    from specgen.bench import copy_bandwidth_gbs
    from specgen.verify.physics import hbm_peak_gbs

    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": sys.version.split()[0], "commit": git_commit(), "host_time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                            time.gmtime())}
    env["gpu_memory_gb"] = torch.cuda.get_device_properties(0).total_memory / 1e9
    env["copy_gbs"] = copy_bandwidth_gbs()
    env["hbm_peak_gbs"] = hbm_peak_gbs()
    env["neg_gbs"] = {d: neg_bandwidth_gbs(d) for d in dtypes}
    return env


# ------------------------------------------------------------------ one spec (GPU)

class OutOfTime(Exception):
    pass


def user_path_tunes() -> bool:
    """Whether `specgen generate` autotunes: issue #12 gives it a `--tune-budget` option when it
    does (today it asks the builtin agent for the default variant only)."""
    import argparse

    try:
        from specgen.cli import build_parser

        parser = build_parser()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and "generate" in action.choices:
                options = {o for a in action.choices["generate"]._actions for o in a.option_strings}
                return any(o.startswith("--tune") and o != "--no-tune" for o in options)
    except Exception:  # noqa: BLE001 - the CLI changed shape: assume the default variant
        pass
    return False


def generate(spec, args, timing_spec=None) -> tuple[dict, object]:
    """The user's path, nothing written: (problem fields, library path or None). `timing_spec`:
    the tuner times its variants at that spec's benchmark shapes."""
    from specgen.agents.builtin import generate_builtin

    kwargs = {"gpu": True, "write": False, "bench": False, "tune": args.tune_on, "timing_spec": timing_spec}
    params = inspect.signature(generate_builtin).parameters
    if args.examples:
        kwargs["examples"] = args.examples
    if args.tune_on:  # the tuner's budget as `specgen generate` gives it (its default unless --tune-budget)
        from specgen.agents.builtin.tune import DEFAULT_BUDGET_S

        kwargs["tune_budget_s"] = args.tune_budget if args.tune_budget is not None else DEFAULT_BUDGET_S
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    gen = generate_builtin(spec, **kwargs)
    fields = {"variant": gen.variant, "notes": list(gen.notes),
              "verdicts": {k: (v.to_json() if hasattr(v, "to_json") else str(v)) for k, v in gen.verdicts.items()},
              "tune_timings": gen.timings}
    passed = [v for v in gen.verdicts.values() if getattr(v, "passed", False)]
    fields["verified"] = bool(passed)
    return fields, gen.library


def row_plan(spec, shapes: list[dict], dtypes: list[str], directions: list[str]) -> list[tuple]:
    return [(dims, dtype, d) for dims in shapes for dtype in dtypes for d in directions]


VERIFY_TIMED_SETS = 6  # specgen/verify/engine.py: TIMED_REPS + TIMED_WARMUP input sets at every benchmark shape
TIMED_BATCH_MIN, TIMED_OUTPUT_BYTES = 2, 4 << 30  # specgen/verify/timed.py: output copies staged per batch


def footprint(spec, dims: dict, dtype: str, direction: str, sets: int, calls: int | None = None) -> int:
    """GPU bytes a checked, timed run of the kernel needs at one shape (a pessimistic model of
    specgen/verify: `sets` prepared input sets, each holding the call's tensors, the reference's
    working outputs and the float64 truth, in this process; the float64 reference run in
    flight; in the kernel's process every set's read tensors and a batch of output copies).
    The verifier's timed phase is `sets=6` at every benchmark shape; bench.py's kernel timing
    is `sets=input_sets`; eager and torch.compile need less than either."""
    sig = spec.signature

    def nbytes(t, as64: bool = False) -> int:
        dt = t.dtype_for(dtype)
        return math.prod(t.shape(dims)) * (8 if as64 and t.is_floating else _itemsize(dt))

    tensors = [p.type for p in sig.inputs if p.is_tensor]
    floating = [t for t in tensors if t.is_floating]
    ins, outs = sum(map(nbytes, tensors)), sum(nbytes(o.type) for o in sig.outputs)
    ins64 = sum(nbytes(t, True) for t in floating)
    outs64 = sum(nbytes(o.type, True) for o in sig.outputs)
    if direction == "forward":
        read, written, written64 = ins, outs, outs64
        in_flight = ins64  # the float64 copy of the inputs while the truth is computed
    else:  # reads inputs, forward outputs and output gradients; writes the input gradients
        read, written = ins + 2 * outs, sum(map(nbytes, floating))
        written64 = ins64
        in_flight = ins64 + 2 * outs64  # float64 autograd: inputs, outputs, output gradients
    calls = calls or sets  # timed calls (warm-up included): up to that many output copies, within 4 GiB
    copies = max(TIMED_BATCH_MIN * written, min(calls * written, TIMED_OUTPUT_BYTES))
    here = sets * (read + written + written64) + in_flight
    kernel_process = sets * read + copies
    return here + kernel_process


def estimate_bytes(spec, dims: dict, dtype: str, direction: str, sets: int) -> int:
    """A row of bench.py: eager and torch.compile (every tensor of the call per set, plus two
    of the largest in flight) or the kernel's checked timing (`footprint`), whichever is more."""
    sizes = tensor_sizes(spec, dims, dtype)
    per_set = sum(sizes) * (2 if direction == "backward" else 1)
    torch_side = per_set * sets + 2 * max(sizes, default=0)
    return max(torch_side, footprint(spec, dims, dtype, direction, sets, calls=REPS + 5))


def spec_with_shapes(spec, shapes: list[dict], folder: Path):
    """A copy of the spec file with only `shapes` as its benchmark, loaded from `folder`: the
    verifier's worker reloads a spec from its path, so the copy must be a file."""
    import yaml

    from specgen.spec import load_spec

    data = yaml.safe_load(Path(spec.path).read_text())
    data["benchmark"] = [dict(s) for s in shapes]
    path = Path(folder) / Path(spec.path).name
    path.write_text(f"# {spec.path} with only some of its benchmark shapes (level1_bench.py)\n"
                    + yaml.safe_dump(data, sort_keys=False, width=1000))
    return load_spec(path)


def verification_shapes(spec, gpu_bytes: int, directions: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    """(benchmark shapes the verifier can run at full size on this GPU, shapes it cannot): the
    verifier times every benchmark shape with VERIFY_TIMED_SETS checked input sets."""
    directions = directions or (["forward", "backward"] if spec.backward == "kernel" else ["forward"])
    fit, dropped = [], []
    for dims in spec.benchmark:
        need = max(footprint(spec, dims, dt, d, VERIFY_TIMED_SETS) for dt in spec.dtypes for d in directions)
        (fit if not gpu_bytes or need <= MEMORY_SHARE * gpu_bytes else dropped).append(dict(dims))
    return fit, dropped


def bench_rows(spec, library, plan: list[tuple], family: str, args, deadline: float, gpu_bytes: int) -> list[dict]:
    """Time every planned row; a failure or the budget ends a row, never the others."""
    import torch

    from specgen.bench import INPUT_SETS, bench_spec

    rows = []

    def base(dims, dtype, direction, status, message=None, **extra):
        sizes = tensor_sizes(spec, dims, dtype)
        return {"name": spec.name, "family": family, "direction": direction, "dims": dict(dims), "dtype": dtype,
                "status": status, "message": message, "largest_bytes": max(sizes, default=0), **extra}

    pending = list(plan)
    while pending:
        dims = pending[0][0]
        group = [p for p in pending if p[0] == dims]  # one shape: every dtype and direction, one kernel process
        pending = [p for p in pending if p[0] != dims]
        if time.time() > deadline:
            rows += [base(*p, NOT_REACHED, "budget spent before this row") for p in group]
            continue
        largest = max(max(tensor_sizes(spec, dims, dt), default=0) for _, dt, _ in group)
        sets = 1 if largest >= LARGE_BYTES else INPUT_SETS
        runnable = []
        for p in group:
            need = estimate_bytes(spec, *p, sets)
            if gpu_bytes and need > MEMORY_SHARE * gpu_bytes:
                rows.append(base(*p, SKIPPED, f"estimated {need / 1e9:.0f} GB > {MEMORY_SHARE:.0%} of the GPU"))
            else:
                runnable.append(p)
        done: dict[tuple, dict] = {}

        def on_row(row, sets=sets):
            key = (shape_text(row.dims), row.dtype, row.direction)
            data = row.as_dict()
            done[key] = base(row.dims, row.dtype, row.direction, ERROR if row.rejected else TIMED,
                             row.rejected, bytes=row.bytes, kernel_us=row.kernel_us, eager_us=row.eager_us,
                             compile_us=row.compile_us, compile_seconds=row.compile_seconds,
                             compile_fallback=row.compile_fallback, notes=list(row.notes), input_sets=sets,
                             eager_graph_us=row.eager_graph_us, compile_graph_us=row.compile_graph_us,
                             copy_fraction=data.get("kernel_roofline_fraction"), floor_us=row.floor_us)
            if time.time() > deadline:
                raise OutOfTime()

        def attempt(items):
            dtypes = list(dict.fromkeys(p[1] for p in items))
            directions = tuple(dict.fromkeys(p[2] for p in items))
            bench_spec(spec, library, shapes=[dims], dtypes=dtypes, directions=directions, reps=args.reps,
                       input_sets=sets, on_row=on_row)

        try:
            if runnable:
                attempt(runnable)
        except OutOfTime:
            pass
        except Exception as error:  # noqa: BLE001 - retry what is left row by row, to pin the failure
            first = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
            for p in runnable:
                if (shape_text(p[0]), p[1], p[2]) in done:
                    continue
                if time.time() > deadline:
                    break
                try:
                    attempt([p])
                except OutOfTime:
                    break
                except Exception as error2:  # noqa: BLE001
                    done[(shape_text(p[0]), p[1], p[2])] = base(
                        *p, ERROR, f"{type(error2).__name__}: {str(error2).splitlines()[0][:300] if str(error2) else ''}"
                        + ("" if str(error2) == str(error) else f" (first failure: {first})"),
                        traceback=traceback.format_exc()[-2000:])
                finally:
                    torch.cuda.empty_cache()
        for p in runnable:
            key = (shape_text(p[0]), p[1], p[2])
            rows.append(done.get(key) or base(*p, NOT_REACHED, "spec or total budget spent before this row"))
        torch.cuda.empty_cache()
    return rows


def run_spec(path: Path, args, deadline: float, env: dict) -> tuple[dict, list[dict]]:
    """One problem: load, lower, generate (verify), time. Returns (problem, rows)."""
    import torch

    from specgen.agents.base import AgentRefused
    from specgen.agents.builtin import build_source
    from specgen.spec import load_spec

    family = spec_family(path)
    problem = {"name": path.stem, "path": str(path), "family": family, "status": None, "lowered": False,
               "verified": None, "message": None}
    try:  # what the GPU had free as the problem began: session 39's H100 run could not create a 5.4 GB
        # arena for maxout_pool3's verification on an 80 GB GPU after batchnorm2d's timing
        problem["gpu_free_bytes_at_start"] = torch.cuda.mem_get_info()[0]
    except Exception:  # noqa: BLE001 - no GPU (the CPU tests' fake one)
        pass
    started = time.time()
    try:
        spec = load_spec(path)
        problem["name"] = spec.name
    except Exception as error:  # noqa: BLE001
        problem.update(status=ERROR, message=f"spec does not load: {type(error).__name__}: {error}")
        return problem, [{"name": problem["name"], "family": family, "status": ERROR, "message": problem["message"]}]
    shapes = select_shapes(spec, args.sizes)
    dtypes = [d for d in spec.dtypes if not args.dtypes or d in args.dtypes]
    directions = ["forward"] + (["backward"] if spec.backward == "kernel" and args.directions == "all" else [])
    plan = row_plan(spec, shapes, dtypes, directions)
    try:
        build_source(spec)
        problem["lowered"] = True
    except AgentRefused as refusal:
        problem.update(status=REFUSED, message=str(refusal))
    except Exception as error:  # noqa: BLE001 - the generator crashed: a row, not an abort
        problem.update(status=ERROR, message=f"lowering crashed: {type(error).__name__}: {error}",
                       traceback=traceback.format_exc()[-3000:])
    problem["planned_rows"] = len(plan)
    if not problem["lowered"]:
        rows = [{"name": spec.name, "family": family, "status": problem["status"], "message": problem["message"],
                 "dims": None}]
        if args.baselines_for_refused and time.time() < deadline and plan:
            rows = bench_rows(spec, None, plan, family, args, deadline, env.get("gpu_bytes", 0))
            for r in rows:
                r["status"], r["message"] = REFUSED, "eager/compile only: " + (problem["message"] or "")[:200]
        problem["seconds"] = round(time.time() - started, 1)
        return problem, rows
    if time.time() > deadline:
        problem.update(status=NOT_REACHED, verified=None, message="total budget spent before generation")
        return problem, [dict(name=spec.name, family=family, status=NOT_REACHED, message=problem["message"],
                              direction=d, dims=dims, dtype=dt) for dims, dt, d in plan]
    verify_spec, scratch = spec, None
    if args.verify_shapes == "fit":
        fit, dropped = verification_shapes(spec, env.get("gpu_bytes", 0))
        if dropped and fit:
            import tempfile

            scratch = tempfile.TemporaryDirectory(prefix="level1-verify-")
            verify_spec = spec_with_shapes(spec, fit, Path(scratch.name))
            problem["verify_dropped_shapes"] = dropped
            problem["verify_note"] = (
                f"verified without the benchmark shape(s) {'; '.join(map(shape_text, dropped))}: the verifier's timed "
                f"phase ({VERIFY_TIMED_SETS} checked input sets with float64 truths) would need more than "
                f"{MEMORY_SHARE:.0%} of the GPU there; those rows are still checked output by output while timed")
    # the tuner times the run's shapes (--sizes) where some were dropped from verification
    # (--tune-shapes all); with tuning off nothing is tuned, so nothing more is timed
    timed_dropped = [s for s in shapes if s in problem.get("verify_dropped_shapes", [])]
    timing_spec = None
    if timed_dropped and args.tune_on and getattr(args, "tune_shapes", "all") == "all":
        timing_spec = spec
        if [dict(s) for s in spec.benchmark] != shapes:  # --sizes left some out: a copy with the run's
            (Path(scratch.name) / "timed").mkdir()
            timing_spec = spec_with_shapes(spec, shapes, Path(scratch.name) / "timed")
        problem["verify_note"] += "; the tuner timed its variants at every benchmark shape of the run (--tune-shapes all)"
    try:
        try:
            fields, library = generate(verify_spec, args, timing_spec)
        finally:
            if scratch is not None:
                scratch.cleanup()  # the library lives in the compile cache, not here
        problem.update(fields)
    except Exception as error:  # noqa: BLE001 - Rejected (no variant verified), CompileError, a crash
        from specgen.errors import Rejected

        problem.update(status=UNVERIFIED if isinstance(error, Rejected) else ERROR, verified=False,
                       message=f"{type(error).__name__}: {str(error)[:1500]}", traceback=traceback.format_exc()[-3000:])
        problem["seconds"] = round(time.time() - started, 1)
        torch.cuda.empty_cache()
        return problem, [{"name": spec.name, "family": family, "status": problem["status"],
                          "message": problem["message"][:300], "dims": None}]
    if not problem["verified"]:
        problem.update(status=UNVERIFIED, message="no variant passed verification")
        problem["seconds"] = round(time.time() - started, 1)
        return problem, [{"name": spec.name, "family": family, "status": UNVERIFIED, "message": problem["message"],
                          "dims": None}]
    problem["status"] = "verified"
    problem["generate_seconds"] = round(time.time() - started, 1)
    spec_deadline = min(deadline, time.time() + args.spec_budget_s)  # the timing's own budget
    rows = bench_rows(spec, library, plan, family, args, spec_deadline, env.get("gpu_bytes", 0))
    dropped = problem.get("verify_dropped_shapes") or []
    for row in rows:
        evaluate_row(row, env.get("neg_gbs") or {}, env.get("hbm_peak_gbs"))
    training_steps(rows)
    for row in rows:
        if row.get("dims") in dropped:
            row["verified_shape"] = False  # checked while timed, not in the verifier's full-size phase
            row.setdefault("notes", []).append("shape left out of the verifier's full-size phase (memory)")
    problem["seconds"] = round(time.time() - started, 1)
    torch.cuda.empty_cache()
    return problem, rows


def not_reached(path: Path, args) -> tuple[dict, list[dict]]:
    family = spec_family(path)
    message = "total budget spent before this problem"
    problem = {"name": path.stem, "path": str(path), "family": family, "status": NOT_REACHED, "lowered": None,
               "verified": None, "message": message}
    return problem, [{"name": path.stem, "family": family, "status": NOT_REACHED, "message": message, "dims": None}]


def lowering_pass(paths: list[Path]) -> dict[str, bool | None]:
    """Lower every spec first (CPU, fast), so a budget cut still says which ones lower."""
    from specgen.agents.base import AgentRefused
    from specgen.agents.builtin import build_source
    from specgen.spec import load_spec

    result = {}
    for path in paths:
        try:
            build_source(load_spec(path))
            result[path.stem] = True
        except AgentRefused:
            result[path.stem] = False
        except Exception:  # noqa: BLE001 - run_spec reports it
            result[path.stem] = None
    return result


# ------------------------------------------------------------------ main

def parse_args(argv=None):
    from specgen.commands import positive

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", action="append", default=None, metavar="DIR",
                        help="folder of specs (repeatable; default benchmarks/level1/specs)")
    parser.add_argument("--out", default=None, help="result folder (default gpu-out/level1)")
    parser.add_argument("--name", default="level1_bench", help="file stem of the JSON and markdown written")
    parser.add_argument("--only", default="", help="comma-separated spec names")
    parser.add_argument("--shard", default=None, metavar="K/N", help="every N-th spec from the K-th (1-based)")
    parser.add_argument("--skip-reached", nargs="+", default=None, metavar="JSON",
                        help="leave out the problems these earlier runs reached (go on with a shard; --merge after)")
    parser.add_argument("--sizes", choices=("decode", "large", "all"), default="all",
                        help=f"benchmark shapes: decode (largest float32 tensor < {DECODE_BYTES >> 20} MiB), large, all")
    parser.add_argument("--dtypes", default="", help="comma-separated dtypes (default: each spec's)")
    parser.add_argument("--directions", choices=("forward", "all"), default="all",
                        help="all: also the backward of specs with `backward: kernel` (default)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="total wall time (default 540)")
    parser.add_argument("--spec-budget-s", type=float, default=150.0,
                        help="per spec, timing rows after generation (default 150)")
    parser.add_argument("--tune", choices=("auto", "on", "off"), default="auto",
                        help="autotune variants as generate_builtin does; auto: as `specgen generate` does")
    parser.add_argument("--tune-budget", type=positive, default=None,  # as `specgen generate --tune-budget`
                        help="the tuner's seconds per spec (default: specgen generate's, 240)")
    parser.add_argument("--examples", type=int, default=None, help="verification examples (default: the verifier's)")
    parser.add_argument("--verify-shapes", choices=("fit", "all"), default="fit",
                        help="fit (default): verify at the benchmark shapes whose full-size timed phase fits in "
                             f"{MEMORY_SHARE * 100:.0f}%% of the GPU (the others are timed, and checked while timed, but "
                             "left out of the verifier's full-size phase; the problem row says so); all: every "
                             "benchmark shape, exactly as `specgen generate` does")
    parser.add_argument("--tune-shapes", choices=("verified", "all"), default="all",
                        help="with --verify-shapes fit: the shapes the tuner times its variants at: all (default, "
                             "as `specgen generate` does: every benchmark shape; the dropped ones decide between "
                             "launches that are the same at the small ones, e.g. sum over dim 1 of [64, 4096, 4095] "
                             "in session 25) or verified (the ones verified; faster: each variant's timing does not "
                             "prepare the large inputs again)")
    parser.add_argument("--min-start-s", type=float, default=30.0,
                        help="start no new spec with less than this left of --budget-s (default 30)")
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--baselines-for-refused", action="store_true",
                        help="also time eager and torch.compile for refused specs (no kernel)")
    parser.add_argument("--summary-only", action="store_true",
                        help="print only the per-family and target tables (rows still go to the files)")
    parser.add_argument("--plan", action="store_true",
                        help="no GPU: print what a run would do (lowered or refused, rows, the shapes left out of "
                             "verification and the rows skipped for memory on a GPU of --gpu-gb)")
    parser.add_argument("--gpu-gb", type=float, default=141.0, help="--plan: the GPU's memory (default 141, an H200)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="merge earlier runs' JSON files into one report (no GPU)")
    args = parser.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    args.dtypes = [s for s in args.dtypes.split(",") if s]
    if args.shard:
        k, _, n = args.shard.partition("/")
        if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
            parser.error("--shard K/N with 1 <= K <= N")
        args.shard = (int(k), int(n))
    return args


def merge(files: list[str]) -> dict:
    """Several runs (shards, or decode and large sizes) as one report: a problem reached in
    any run counts as reached; rows are concatenated, 'not reached' rows dropped where another
    run timed the same row."""
    reports = [json.loads(Path(f).read_text()) for f in files]
    problems: dict[str, dict] = {}
    rank = {NOT_REACHED: 0, None: 0}
    for rep in reports:
        for p in rep["problems"]:
            old = problems.get(p["name"])
            if old is None or rank.get(old.get("status"), 1) < rank.get(p.get("status"), 1):
                problems[p["name"]] = p
    rows, seen = [], set()
    all_rows = [r for rep in reports for r in rep["rows"]]
    key = lambda r: (r["name"], shape_text(r.get("dims")), r.get("dtype"), r.get("direction"))  # noqa: E731
    timed = {key(r) for r in all_rows if r.get("status") != NOT_REACHED}
    for r in all_rows:
        k = key(r)
        if (r.get("status") == NOT_REACHED and k in timed) or (k in seen and r.get("status") == NOT_REACHED):
            continue
        seen.add(k)
        rows.append(r)
    env = reports[-1].get("environment", {})
    return {"specs_folder": " + ".join(dict.fromkeys(str(r.get("specs_folder")) for r in reports)),
            "environment": {**env, "merged_from": files}, "problems": sorted(problems.values(), key=lambda p: p["name"]),
            "rows": rows, "summary": summarize(list(problems.values()), rows)}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out or REPO / "gpu-out" / "level1")
    if args.merge:
        report = merge(args.merge)
        write_report(out, report, args.name)
        print_tables(report, args.summary_only)
        return 0
    if args.plan:
        return plan_run(args)
    started = time.time()
    deadline = started + args.budget_s
    import torch

    if not torch.cuda.is_available():
        print("level1_bench: no CUDA GPU visible; this benchmark runs on the GPU machine "
              "(scripts/gpu-suite level1)", file=sys.stderr)
        return 3
    folders = [Path(f) for f in (args.specs or [DEFAULT_SPECS])]
    paths = find_specs(folders, args.only, args.shard, reached_names(args.skip_reached or []))
    if not paths and args.skip_reached and find_specs(folders, args.only, args.shard):
        print("level1_bench: every selected spec was reached by the runs of --skip-reached; nothing to run")
        return 0
    if not paths:
        print(f"level1_bench: no specs selected in {', '.join(map(str, folders))}", file=sys.stderr)
        return 2
    args.tune_on = {"on": True, "off": False}.get(args.tune) if args.tune != "auto" else user_path_tunes()
    dtypes = sorted({d for p in paths for d in _spec_dtypes(p)} & {"float32", "bfloat16", "float16"}) or ["float32"]
    env = environment(dtypes)
    env["gpu_bytes"] = torch.cuda.get_device_properties(0).total_memory
    env["tune"] = args.tune_on
    env["args"] = {k: v for k, v in vars(args).items() if k != "merge"}
    print(f"[level1] {len(paths)} specs from {', '.join(map(str, folders))}; {env['gpu']}; neg() "
          + ", ".join(f"{d} {g:.0f} GB/s" for d, g in env["neg_gbs"].items())
          + f"; copy {env['copy_gbs']:.0f} GB/s; HBM peak {env['hbm_peak_gbs']:.0f} GB/s; tune {args.tune_on}", flush=True)
    lowering = lowering_pass(paths)
    print(f"[level1] lowering: {sum(v is True for v in lowering.values())} lowered, "
          f"{sum(v is False for v in lowering.values())} refused, {sum(v is None for v in lowering.values())} errors "
          f"({time.time() - started:.0f} s)", flush=True)
    report = {"specs_folder": ", ".join(map(str, folders)), "environment": env, "problems": [], "rows": [],
              "lowering": lowering}
    for path in run_order(paths, lowering):
        t0 = time.time()
        if time.time() > deadline - args.min_start_s and lowering.get(path.stem) is not False:
            # (a refused spec still gets its refusal row: that costs no GPU time)
            problem, rows = not_reached(path, args)
            problem["lowered"] = lowering.get(path.stem)
        else:
            # a problem that runs past the call's end leaves this line alone to name it
            print(f"[level1] spec {path.stem}: started ({time.time() - started:.0f} s total)", flush=True)
            try:
                problem, rows = run_spec(path, args, deadline, env)
            except Exception as error:  # noqa: BLE001 - never an abort
                problem = {"name": path.stem, "path": str(path), "family": spec_family(path), "status": ERROR,
                           "lowered": lowering.get(path.stem), "verified": None,
                           "message": f"{type(error).__name__}: {str(error)[:500]}",
                           "traceback": traceback.format_exc()[-3000:]}
                rows = [{"name": path.stem, "family": problem["family"], "status": ERROR, "message": problem["message"],
                         "dims": None}]
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as error:  # noqa: BLE001 - a poisoned context: later specs will say so
                problem.setdefault("notes", []).append(f"CUDA after this spec: {error}")
        report["problems"].append(problem)
        report["problems"].sort(key=lambda p: p["name"])
        report["rows"] += rows
        report["rows"].sort(key=lambda r: r["name"])  # stable: each problem's rows keep their order
        report["summary"] = summarize(report["problems"], report["rows"])
        report["seconds"] = round(time.time() - started, 1)
        write_report(out, report, args.name)
        if problem.get("status") != NOT_REACHED:
            timed = [r for r in rows if r.get("status") == TIMED]
            print(f"[level1] spec {problem['name']}: {problem.get('status')}, {len(timed)} rows timed, "
                  f"{sum(1 for r in timed if not r.get('misses'))} on target ({time.time() - t0:.0f} s, "
                  f"{time.time() - started:.0f} s total)", flush=True)
    print_tables(report, args.summary_only)
    print(f"[level1] wrote {out / (args.name + '.json')} and .md in {time.time() - started:.0f} s")
    return 0


def plan_run(args) -> int:
    """--plan: lowering and the row plan of every selected spec, on the CPU."""
    from rich.console import Console
    from rich.table import Table

    from specgen.spec import load_spec

    folders = [Path(f) for f in (args.specs or [DEFAULT_SPECS])]
    paths = find_specs(folders, args.only, args.shard, reached_names(args.skip_reached or []))
    lowering = lowering_pass(paths)
    gpu_bytes = int(args.gpu_gb * 1e9)
    table = Table(title=f"plan: {', '.join(map(str, folders))} (GPU of {args.gpu_gb:.0f} GB)")
    for col in ("order", "problem", "family", "lowering", "rows", "verified without", "rows skipped (memory)"):
        table.add_column(col, overflow="fold")
    total = 0
    for i, path in enumerate(run_order(paths, lowering), 1):
        spec = load_spec(path)
        shapes = select_shapes(spec, args.sizes)
        dtypes = [d for d in spec.dtypes if not args.dtypes or d in args.dtypes]
        directions = ["forward"] + (["backward"] if spec.backward == "kernel" and args.directions == "all" else [])
        plan = row_plan(spec, shapes, dtypes, directions)
        state = {True: "lowered", False: "refused", None: "error"}[lowering.get(path.stem)]
        skipped = []
        for dims, dtype, direction in plan:
            sets = 1 if max(tensor_sizes(spec, dims, dtype)) >= LARGE_BYTES else 3
            need = estimate_bytes(spec, dims, dtype, direction, sets)
            if need > MEMORY_SHARE * gpu_bytes:
                skipped.append(f"{shape_text(dims)} {dtype} {direction} ({need / 1e9:.0f} GB)")
        dropped = verification_shapes(spec, gpu_bytes)[1] if args.verify_shapes == "fit" else []
        total += len(plan) if state == "lowered" else 0
        table.add_row(str(i), spec.name, spec_family(path), state, str(len(plan) if state == "lowered" else 0),
                      "; ".join(map(shape_text, dropped)), "; ".join(skipped))
    Console(width=max(160, int(os.environ.get("COLUMNS", "0") or 0))).print(table)
    print(f"{sum(v is True for v in lowering.values())} of {len(paths)} lowered; {total} rows to time")
    return 0


def _spec_dtypes(path: Path) -> list[str]:
    try:
        from specgen.spec import load_spec

        return list(load_spec(path).dtypes)
    except Exception:  # noqa: BLE001
        return []


if __name__ == "__main__":
    sys.exit(main())
