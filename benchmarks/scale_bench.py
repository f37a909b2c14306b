"""Scale-out benchmark: `specgen build` of the example specs from a clean state (no lock, no
kernels, an empty compile cache), on one GPU and on every GPU, with the wall time of each
and a check that the locks agree (kernel hash, agent, reference path, tuning decision and
variant, verified) per op.

    python benchmarks/scale_bench.py --out DIR [--configs gpus0,all,dask] [--command build|generate]
        [--specs gelu_tanh,softmax] [--timeout 560] [--state FILE] [--extra "--tune-budget 30"]

Configs: `inproc` (no --gpus: the one-GPU path in one process), `gpus0` (--gpus 0),
`all` (--gpus all), `dask` (--gpus all --backend dask: a local Dask cluster, dask-cuda's
LocalCUDACluster when installed). Each run's result is merged into --state (default
gpu-out/scale_state.json, kept between calls on a warm machine) so the configs can be run
in separate calls under a per-call time limit; DIR/scale_bench.json and the table printed
hold every run so far.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OPS = ["gelu_tanh", "bias_gelu", "swiglu", "layernorm_gelu", "rmsnorm", "add_rmsnorm", "softmax", "log_softmax",
       "cross_entropy", "rope"]
CONFIGS = {"inproc": [], "gpus0": ["--gpus", "0"], "all": ["--gpus", "all"],
           "dask": ["--gpus", "all", "--backend", "dask"]}


def lock_summary(folder: Path) -> dict:
    """What must agree between runs, per op."""
    path = folder / "specgen.lock"
    if not path.is_file():
        return {}
    ops = json.loads(path.read_text())["ops"]
    out = {}
    for op, entry in sorted(ops.items()):
        tuning = entry.get("tuning") or {}
        out[op] = {"kernel_hash": entry.get("kernel_hash") or None, "agent": entry.get("agent"),
                   "reference": bool(entry.get("reference")), "decision": tuning.get("decision"),
                   "variant": tuning.get("variant"),
                   "verified": any(((r.get("verification") or {}).get("passed", True)) and r.get("verification")
                                   for r in entry.get("records") or [])}
    return out


def run_config(name: str, specs: list[str], command: str, timeout: float, work: Path,
               extra: list[str] = ()) -> dict:
    folder = work / name / "specs"
    folder.mkdir(parents=True)
    for op in specs:
        shutil.copy(REPO / "specs" / f"{op}.yaml", folder / f"{op}.yaml")
    cache = work / name / "cache"
    env = dict(os.environ, SPECGEN_CACHE_DIR=str(cache), PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}")
    argv = [sys.executable, "-m", "specgen.cli", command, str(folder), *CONFIGS[name],
            "--transcript-dir", str(work / name / "transcripts"), "--json", str(work / name / "result.json"),
            *extra]
    if command == "build":
        argv += ["-o", str(work / name / "dist"), "--keep-tree", str(work / name / "tree")]
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, env=env, cwd=work / name, timeout=timeout, capture_output=True, text=True)
        code, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as error:
        code, log = "timeout", (error.stdout or b"").decode(errors="replace") if isinstance(error.stdout, bytes) \
            else (error.stdout or "")
    wall = time.monotonic() - started
    (work / f"{name}.log").write_text(log)
    return {"config": name, "argv": argv[3:], "command": command, "exit": code, "wall_s": round(wall, 1),
            "timed_out": code == "timeout",
            "ops": specs, "lock": lock_summary(folder), "log_tail": log[-3000:]}


def compare(runs: dict) -> dict:
    """Per pair against the first one-GPU run: the ops whose lock summary differs."""
    base_name = next((n for n in ("gpus0", "inproc") if n in runs), None)
    if base_name is None:
        return {}
    base = runs[base_name]
    out = {}
    for name, run in runs.items():
        if name == base_name:
            continue
        differ = {op: {"base": base["lock"].get(op), "this": run["lock"].get(op)}
                  for op in sorted(set(base["lock"]) | set(run["lock"]))
                  if base["lock"].get(op) != run["lock"].get(op)}
        hashes_same = all((base["lock"].get(op) or {}).get("kernel_hash") == (run["lock"].get(op) or {}).get("kernel_hash")
                          for op in set(base["lock"]) | set(run["lock"]))
        out[name] = {"baseline": base_name, "same_lock": not differ, "same_kernel_hashes": hashes_same,
                     "speedup": round(base["wall_s"] / run["wall_s"], 3) if run["wall_s"] else None,
                     "ratio": round(run["wall_s"] / base["wall_s"], 3) if base["wall_s"] else None,
                     "differences": differ}
    return out


def table(runs: dict, comparison: dict) -> str:
    lines = ["| config | command | exit | wall (s) | vs 1 GPU | same lock | same kernel hashes |",
             "|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        c = comparison.get(name, {})
        ratio = f"{c['ratio']:.2f}x" if c.get("ratio") else "baseline" if not c else "-"
        lines.append(f"| {name} | {run['command']} | {run['exit']} | {run['wall_s']:.1f} | {ratio} | "
                     f"{c.get('same_lock', '-')} | {c.get('same_kernel_hashes', '-')} |")
    for name, c in comparison.items():
        for op, d in c["differences"].items():
            lines.append(f"  {name} differs on {op}: {json.dumps(d['base'])} vs {json.dumps(d['this'])}")
    return "\n".join(lines)


def gpu_facts() -> dict:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        return {"gpus": out}
    except (OSError, subprocess.SubprocessError):
        return {"gpus": []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", default="gpus0,all")
    parser.add_argument("--command", choices=("build", "generate"), default="build")
    parser.add_argument("--specs", default=",".join(OPS))
    parser.add_argument("--timeout", type=float, default=560)
    parser.add_argument("--state", default=str(REPO / "gpu-out" / "scale_state.json"))
    parser.add_argument("--fresh", action="store_true", help="forget the runs kept in --state")
    parser.add_argument("--extra", default="", help="more options for every run, e.g. '--tune-budget 30'")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state_path = Path(args.state)
    state = {} if args.fresh or not state_path.is_file() else json.loads(state_path.read_text())
    runs = state.get("runs", {})
    specs = [s for s in args.specs.split(",") if s]
    budget_end = time.monotonic() + args.timeout
    for name in [c for c in args.configs.split(",") if c]:
        if name not in CONFIGS:
            parser.error(f"unknown config {name!r}: {', '.join(CONFIGS)}")
        left = budget_end - time.monotonic()
        if left < 30:
            print(f"scale_bench: no time left for {name}; run it in another call (its state is kept)")
            continue
        work = Path(tempfile.mkdtemp(prefix=f"specgen-scale-{name}-"))
        print(f"scale_bench: {name}: specgen {args.command} of {len(specs)} specs from a clean state ...", flush=True)
        run = run_config(name, specs, args.command, left, work, args.extra.split())
        shutil.copy(work / f"{name}.log", out / f"{name}.log")
        shutil.rmtree(work, ignore_errors=True)
        print(f"scale_bench: {name}: exit {run['exit']} in {run['wall_s']:.1f} s", flush=True)
        runs[name] = run
        state = {"runs": runs, **gpu_facts()}
        state_path.parent.mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(state, indent=1))
    comparison = compare(runs)
    result = {"runs": runs, "comparison": comparison, **gpu_facts()}
    (out / "scale_bench.json").write_text(json.dumps(result, indent=1))
    text = table(runs, comparison)
    (out / "scale_bench.md").write_text(text + "\n")
    print(text)
    return 0 if all(r["exit"] in (0, 1) for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
