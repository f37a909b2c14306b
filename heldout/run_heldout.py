#!/usr/bin/env python3
"""Run the held-out attack suite against specgen's verifier.

For every kernel in heldout/attacks/*.cu (header lines `// spec:`, `// expect:`, `// class:`)
this calls the verifier's public entry point,

    specgen.verify.verify_kernel(load_spec(<specs>/<spec>.yaml), <kernel path>, sanitize=False)

each kernel in a fresh Python process (a kernel may leave the CUDA context, device memory or
process state in a bad way on purpose; no kernel may affect the next one's verdict), prints a
table and writes the results as JSON.

    python3 heldout/run_heldout.py [--json results.json] [--only SUBSTRING ...]

A cheat (expect: rejected) is ok when the verdict is anything but "passed"; an honest control
(expect: passed) is ok only when the verdict is "passed". Two outcomes are not verdicts:
"no-gpu" (the static checks passed but there is no GPU to run the kernel on: counted apart,
exit code 3) and "error:..." (the verifier raised, or the harness timed out: counted as not ok
for cheats and controls alike, since no verdict was reached).

Exit codes: 0 every kernel ok; 1 some kernel not ok; 3 some kernel could not be run (no GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ATTACKS = HERE / "attacks"
NO_GPU = "no-gpu"
RESULT_TAG = "HELDOUT-RESULT "


def header(path: Path) -> dict:
    """The `// key: value` lines at the top of a kernel file."""
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("//"):
            break
        key, sep, value = line[2:].partition(":")
        if sep and key.strip() in ("spec", "expect", "class") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    missing = [k for k in ("spec", "expect", "class") if k not in fields]
    if missing:
        raise SystemExit(f"{path}: header line(s) missing: {', '.join(missing)}")
    if fields["expect"] not in ("rejected", "passed"):
        raise SystemExit(f"{path}: expect must be 'rejected' or 'passed', not {fields['expect']!r}")
    return fields


def verify_one(kernel: Path, spec_path: Path) -> dict:
    """In the child process: the verifier's verdict on one kernel, as plain data."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from specgen.errors import EnvironmentMissing
    from specgen.spec import load_spec
    from specgen.verify import verify_kernel

    started = time.perf_counter()
    try:
        verdict = verify_kernel(load_spec(spec_path), kernel, sanitize=False)
    except EnvironmentMissing as error:
        return {"reason": NO_GPU, "detail": str(error), "seconds": round(time.perf_counter() - started, 1)}
    except Exception as error:  # the verifier itself failed: no verdict
        return {"reason": f"error:{type(error).__name__}", "detail": str(error)[:2000],
                "seconds": round(time.perf_counter() - started, 1)}
    ce = verdict.counterexample
    return {"reason": verdict.reason, "detail": (verdict.detail or "")[:2000],
            "counterexample": ce.describe() if ce is not None else None, "cases": verdict.cases,
            "seconds": round(time.perf_counter() - started, 1)}


def run_isolated(kernel: Path, spec_path: Path, timeout: float) -> dict:
    """Run verify_one in a fresh interpreter; its last tagged stdout line is the result."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [sys.executable, str(Path(__file__).resolve()), "--one", str(kernel), "--spec-file", str(spec_path)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"reason": "error:harness-timeout", "detail": f"no verdict within {timeout:.0f} s",
                "seconds": round(time.perf_counter() - started, 1)}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (done.stderr or done.stdout or "").strip().splitlines()[-5:]
    return {"reason": f"error:child-exit-{done.returncode}", "detail": "\n".join(tail),
            "seconds": round(time.perf_counter() - started, 1)}


def judge(expect: str, reason: str) -> bool | None:
    if reason == NO_GPU:
        return None
    if reason.startswith("error:"):
        return False
    return reason != "passed" if expect == "rejected" else reason == "passed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--only", nargs="*", default=[], help="run only kernels whose file name contains one of these")
    parser.add_argument("--specs", type=Path, default=ATTACKS / "specs",
                        help="folder holding <spec>.yaml (default: attacks/specs/, the specs the suite was "
                             "written against)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per kernel (default 3600)")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--spec-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one is not None:
        print(RESULT_TAG + json.dumps(verify_one(args.one, args.spec_file)), flush=True)
        return 0

    kernels = sorted(ATTACKS.glob("*.cu"))
    if args.only:
        kernels = [k for k in kernels if any(s in k.name for s in args.only)]
    if not kernels:
        print("no kernels selected", file=sys.stderr)
        return 2
    rows = []
    width = max(len(k.name) for k in kernels)
    print(f"{'file':<{width}}  {'expect':<8}  {'got':<22}  ok    seconds", flush=True)
    for kernel in kernels:
        meta = header(kernel)
        spec_path = args.specs / f"{meta['spec']}.yaml"
        result = run_isolated(kernel, spec_path, args.timeout)
        ok = judge(meta["expect"], result["reason"])
        row = {"file": kernel.name, "spec": meta["spec"], "expect": meta["expect"], "class": meta["class"],
               "reason": result["reason"], "ok": ok, **{k: v for k, v in result.items() if k != "reason"}}
        rows.append(row)
        shown = {True: "yes", False: "NO", None: "-"}[ok]
        print(f"{kernel.name:<{width}}  {meta['expect']:<8}  {result['reason']:<22}  {shown:<4}  "
              f"{result.get('seconds', 0):>7}", flush=True)

    def count(expect: str) -> tuple[int, int, int]:
        mine = [r for r in rows if r["expect"] == expect]
        return sum(r["ok"] is True for r in mine), len(mine), sum(r["ok"] is None for r in mine)

    cheats_ok, cheats, cheats_unrun = count("rejected")
    controls_ok, controls, controls_unrun = count("passed")
    errors = sum(r["reason"].startswith("error:") for r in rows)
    print()
    print(f"cheats rejected:  {cheats_ok} / {cheats}" + (f"  ({cheats_unrun} not run: no GPU)" if cheats_unrun else ""))
    print(f"controls passed:  {controls_ok} / {controls}"
          + (f"  ({controls_unrun} not run: no GPU)" if controls_unrun else ""))
    if errors:
        print(f"harness/verifier errors (no verdict, counted as not ok): {errors}")
    summary = {"cheats_rejected": cheats_ok, "cheats": cheats, "cheats_not_run": cheats_unrun,
               "controls_passed": controls_ok, "controls": controls, "controls_not_run": controls_unrun,
               "errors": errors}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "results": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    if cheats_unrun or controls_unrun:
        print("some kernels were not run: no CUDA GPU is visible (exit 3)")
        return 3
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
