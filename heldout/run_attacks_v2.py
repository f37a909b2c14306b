#!/usr/bin/env python3
"""Run a held-out attack folder (default heldout/attacks-v2) through the verifier, then the benchmark.

The folder holds one `.cu` per candidate and a `manifest.json` listing each file's spec,
class, expected outcome (`reject` with the expected reason(s), or `pass` for an honest
control) and whether the symbol check is expected to refuse it before it runs.

For every kernel, each step in a fresh Python process (a kernel may leave its process, the
CUDA context or device memory in a bad state on purpose; none may affect another's result):

1. verify: `specgen.verify.verify_kernel(load_spec(specs/<spec>.yaml), <file>, sanitize=...)`;
2. bench (unless --no-bench), for kernels the verifier passed: `specgen bench <spec> --kernel
   <file> --no-compile --json ...` at the spec's benchmark shapes; a benchmark that rejects a
   row (wrong output while timed, or a time below the physics floor) exits 1.

    python heldout/run_attacks_v2.py heldout/attacks-v2 --out results.json
    python heldout/run_attacks_v2.py heldout/attacks-v2 --only softmax_ gelu_tanh_control --no-bench

Scoring, per row:
- a cheat (expect reject) is `caught` when the verifier's reason is anything but `passed`;
  `reason_as_expected` says whether it is one of the listed reasons; `bench_rejected` says
  whether the benchmark refused the timings of a cheat the verifier let through;
- a control (expect pass) is ok only when the verifier passes it (and the benchmark, when run,
  does not reject it);
- `no-gpu` (clean static checks but no GPU) is not scored; `error:...` (the verifier raised,
  a child died or timed out) counts as not ok.

Exit codes: 0 every kernel ok; 1 some kernel not ok; 2 nothing selected or a bad manifest;
3 some kernel could not be run (no GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_FOLDER = HERE / "attacks-v2"
NO_GPU = "no-gpu"
TAG = "ATTACKS-V2-RESULT "


def suite_specs(folder: Path) -> Path:
    """The specs a suite was written against: its own specs/ when it has one.

    A spec can change after a suite is written (cross_entropy and rmsnorm gained saved
    statistics, new ABI outputs): verified against the new spec, an old kernel leaves the new
    output unwritten and every one of its rows is decided by that, not by its attack."""
    own = folder / "specs"
    return own if own.is_dir() else REPO / "specs"


def load_manifest(folder: Path) -> list[dict]:
    """The manifest's kernel entries; the manifest and the folder's .cu files must agree."""
    data = json.loads((folder / "manifest.json").read_text())
    entries = data["kernels"]
    listed = {e["file"] for e in entries}
    present = {p.name for p in folder.glob("*.cu")}
    problems = []
    if len(listed) != len(entries):
        problems.append("a file is listed twice")
    if present - listed:
        problems.append(f"not in the manifest: {sorted(present - listed)}")
    if listed - present:
        problems.append(f"listed but missing: {sorted(listed - present)}")
    for e in entries:
        if e.get("expect") not in ("reject", "pass"):
            problems.append(f"{e.get('file')}: expect must be reject or pass")
    if problems:
        raise SystemExit(f"{folder / 'manifest.json'}: " + "; ".join(problems))
    return entries


# ------------------------------------------------------------------ child modes

def verify_child(kernel: Path, spec_path: Path, sanitize: bool) -> dict:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from specgen.errors import EnvironmentMissing
    from specgen.spec import load_spec
    from specgen.verify import verify_kernel

    started = time.perf_counter()
    try:
        verdict = verify_kernel(load_spec(spec_path), kernel, sanitize=sanitize)
    except EnvironmentMissing as error:
        return {"reason": NO_GPU, "detail": str(error)[:500], "seconds": round(time.perf_counter() - started, 1)}
    except Exception as error:  # the verifier itself failed: no verdict
        return {"reason": f"error:{type(error).__name__}", "detail": str(error)[:2000],
                "seconds": round(time.perf_counter() - started, 1)}
    ce = verdict.counterexample
    timed = {k: v for k, v in (verdict.timings or {}).items() if k.startswith("timed_us")}
    # the aggregate error measure per direction/dtype (measured, not enforced: docs/VERIFIER.md)
    norms = {key: t.get("max_error_norm_ratio") for key, t in (verdict.tolerances or {}).items()}
    return {"reason": verdict.reason, "detail": (verdict.detail or "")[:2000],
            "counterexample": ce.describe() if ce is not None else None, "cases": verdict.cases,
            "timed_us": timed, "error_norm_ratios": norms, "seconds": round(time.perf_counter() - started, 1)}


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_verify(kernel: Path, spec_path: Path, timeout: float, sanitize: bool) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--verify-one", str(kernel), "--spec-file",
               str(spec_path)] + (["--sanitize"] if sanitize else [])
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_child_env(),
                              cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"reason": "error:harness-timeout", "detail": f"no verdict within {timeout:.0f} s",
                "seconds": round(time.perf_counter() - started, 1)}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    tail = (done.stderr or done.stdout or "").strip().splitlines()[-5:]
    return {"reason": f"error:child-exit-{done.returncode}", "detail": "\n".join(tail),
            "seconds": round(time.perf_counter() - started, 1)}


def run_bench(kernel: Path, spec_path: Path, timeout: float) -> dict:
    """`specgen bench` in its own process: exit 0 timings accepted, 1 a row rejected."""
    with tempfile.TemporaryDirectory(prefix="attacks-v2-bench-") as tmp:
        out = Path(tmp) / "bench.json"
        command = [sys.executable, "-c", "import sys; from specgen.cli import main; sys.exit(main(sys.argv[1:]))",
                   "bench", str(spec_path), "--kernel", str(kernel), "--no-compile", "--json", str(out)]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_child_env(),
                                  cwd=str(REPO))
        except subprocess.TimeoutExpired:
            return {"bench": "error:harness-timeout", "seconds": round(time.perf_counter() - started, 1)}
        seconds = round(time.perf_counter() - started, 1)
        rows = []
        if out.exists():
            try:
                record = json.loads(out.read_text())
                for row in record.get("rows", []):
                    rows.append({k: row.get(k) for k in ("direction", "dtype", "dims", "kernel_us", "eager_us",
                                                         "rejected", "kernel_roofline_fraction")})
            except (ValueError, AttributeError):
                pass
        status = {0: "accepted", 1: "rejected", 3: NO_GPU}.get(done.returncode, f"error:exit-{done.returncode}")
        tail = "\n".join((done.stderr or done.stdout or "").strip().splitlines()[-8:])
        return {"bench": status, "bench_rows": rows, "bench_tail": tail[-2000:] if status != "accepted" else "",
                "bench_seconds": seconds}


# ------------------------------------------------------------------ scoring

def score(entry: dict, result: dict) -> bool | None:
    reason = result["reason"]
    if reason == NO_GPU:
        return None
    if reason.startswith("error:"):
        return False
    if entry["expect"] == "reject":
        return reason != "passed"
    return reason == "passed" and result.get("bench") in (None, "accepted", "skipped")



def selects(pattern: str, file: str) -> bool:
    """`--only`: a substring of the file's name, or the whole name when it ends in .cu (attacks-v9's
    neutral names: softmax_a.cu is also inside log_softmax_a.cu)."""
    return file == pattern if pattern.endswith(".cu") else pattern in file

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=DEFAULT_FOLDER,
                        help="the attack folder with its manifest.json (default heldout/attacks-v2)")
    parser.add_argument("--out", "--json", dest="out", type=Path, help="write every row and a summary here as JSON")
    parser.add_argument("--only", nargs="*", default=[],
                        help="only files whose name contains one of these (a name ending in .cu: that file alone)")
    parser.add_argument("--specs", type=Path, default=None,
                        help="folder of <spec>.yaml (default: the suite's own specs/, the specs it was written "
                             "against; else the repo's specs/)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per verification (default 3600)")
    parser.add_argument("--bench-timeout", type=float, default=1800.0, help="seconds per benchmark (default 1800)")
    parser.add_argument("--no-bench", action="store_true", help="verify only")
    parser.add_argument("--sanitize", action="store_true", help="also run compute-sanitizer in each verification")
    parser.add_argument("--verify-one", type=Path, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--spec-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.verify_one is not None:
        print(TAG + json.dumps(verify_child(args.verify_one, args.spec_file, args.sanitize)), flush=True)
        return 0

    folder = args.folder.resolve()
    entries = load_manifest(folder)
    specs = args.specs or suite_specs(folder)
    if args.only:
        entries = [e for e in entries if any(selects(s, e["file"]) for s in args.only)]
    if not entries:
        print("no kernels selected", file=sys.stderr)
        return 2
    width = max(len(e["file"]) for e in entries)
    print(f"{'file':<{width}}  {'expect':<6}  {'verify':<22}  {'as exp':<6}  {'bench':<9}  ok    seconds", flush=True)
    rows = []
    for entry in entries:
        kernel = folder / entry["file"]
        spec_path = specs / f"{entry['spec']}.yaml"
        result = run_verify(kernel, spec_path, args.timeout, args.sanitize)
        if args.no_bench or result["reason"] != "passed":
            result["bench"] = "skipped"
        else:
            result.update(run_bench(kernel, spec_path, args.bench_timeout))
        ok = score(entry, result)
        expected = entry["reasons"]
        as_expected = result["reason"] in expected
        row = {**entry, "got": result["reason"], "reason_as_expected": as_expected, "ok": ok,
               "caught": entry["expect"] == "reject" and result["reason"] not in ("passed", NO_GPU)
               and not result["reason"].startswith("error:"),
               "bench_rejected": result.get("bench") == "rejected",
               **{k: v for k, v in result.items() if k != "reason"}}
        rows.append(row)
        shown = {True: "yes", False: "NO", None: "-"}[ok]
        seconds = result.get("seconds", 0) + result.get("bench_seconds", 0)
        print(f"{entry['file']:<{width}}  {entry['expect']:<6}  {result['reason'][:22]:<22}  "
              f"{'yes' if as_expected else 'no':<6}  {result['bench']:<9}  {shown:<4}  {seconds:>7.1f}", flush=True)
        if args.out:  # after every kernel: a run cut by a time limit keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"partial": True, "results": rows}, indent=2) + "\n")

    cheats = [r for r in rows if r["expect"] == "reject"]
    controls = [r for r in rows if r["expect"] == "pass"]
    summary = {
        "cheats": len(cheats),
        "cheats_rejected_by_verify": sum(r["caught"] for r in cheats),
        "cheats_rejected_with_expected_reason": sum(r["caught"] and r["reason_as_expected"] for r in cheats),
        "cheats_passed_verify_but_rejected_by_bench": sum((r["got"] == "passed") and r["bench_rejected"]
                                                          for r in cheats),
        "controls": len(controls),
        "controls_passed": sum(r["ok"] is True for r in controls),
        "not_run_no_gpu": sum(r["ok"] is None for r in rows),
        "errors": sum(r["got"].startswith("error:") for r in rows),
        "by_spec": {},
    }
    for r in rows:
        s = summary["by_spec"].setdefault(r["spec"], {"cheats": 0, "caught": 0, "controls": 0, "controls_passed": 0})
        if r["expect"] == "reject":
            s["cheats"] += 1
            s["caught"] += bool(r["caught"])
        else:
            s["controls"] += 1
            s["controls_passed"] += r["ok"] is True
    print()
    print(f"cheats rejected by verify:   {summary['cheats_rejected_by_verify']} / {len(cheats)} "
          f"({summary['cheats_rejected_with_expected_reason']} with an expected reason)")
    print(f"cheats passed verify, rejected by bench: {summary['cheats_passed_verify_but_rejected_by_bench']}")
    print(f"controls passed:             {summary['controls_passed']} / {len(controls)}")
    if summary["errors"]:
        print(f"harness/verifier errors (no verdict, counted as not ok): {summary['errors']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "results": rows}, indent=2) + "\n")
        print(f"wrote {args.out}")
    if summary["not_run_no_gpu"]:
        print("some kernels were not run: no CUDA GPU is visible (exit 3)")
        return 3
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
