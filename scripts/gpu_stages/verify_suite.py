"""The verifier on the GPU, kernel by kernel: every adversarial kernel must get its reason,
every good and committed kernel must pass, the held-out attacks are counted. Also the time
of one verification on a warm worker, alone and with 4 in parallel, and the benchmark's
timed-and-checked path on a good kernel. Writes JSON (--json) and prints a table last."""
from __future__ import annotations

import argparse
import os
import json
import re
import sys
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))


def header(path: Path) -> dict:
    found = {}
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"^//\s*(spec|expect|sanitize|direction|class):\s*(\S+)", line)
        if m:
            found[m.group(1)] = m.group(2)
        elif not line.startswith("//"):
            break
    return found


def kernels(group: str) -> list[tuple[str, Path, str, bool]]:
    """(spec name, kernel path, expected reason, sanitize) of a group."""
    if group == "committed":
        return [(p.stem, p, "passed", False) for p in sorted((REPO / "specs" / "kernels").glob("*.cu"))]
    if group == "good":
        return [(p.stem.split("__")[0], p, "passed", False) for p in sorted((REPO / "tests" / "kernels").glob("*.cu"))]
    folder = {"adversarial": REPO / "tests" / "adversarial", "heldout": REPO / "heldout" / "attacks"}[group]
    out = []
    for p in sorted(folder.glob("*.cu")):
        meta = header(p)
        if "spec" in meta and "expect" in meta:
            out.append((meta["spec"], p, meta["expect"], meta.get("sanitize") == "yes"))
    return out


def spec_path_for(spec_name: str, kernel: Path) -> Path:
    """The spec a kernel was written against: a hand-written kernel of tests/ its pinned copy
    (tests/verify_specs, as the CPU tests use), a held-out one its suite's specs/, else specs/.
    Against a spec that gained an output since (rmsnorm's saved rstd), every one of its verdicts
    would be that output left unwritten."""
    from verify_support import kernel_spec_path

    if kernel.parent.parent == REPO / "tests":
        return kernel_spec_path(spec_name)
    own = kernel.parent / "specs" / f"{spec_name}.yaml"
    return own if own.exists() else REPO / "specs" / f"{spec_name}.yaml"


def verify_one(spec_name: str, path: Path, sanitize: bool, worker=None) -> dict:
    from specgen.spec import load_spec
    from specgen.verify import verify_kernel

    started = time.perf_counter()
    try:
        verdict = verify_kernel(load_spec(spec_path_for(spec_name, path)), path, sanitize=sanitize,
                                worker=worker)
        return {"got": verdict.reason, "detail": verdict.detail[:700], "cases": verdict.cases,
                "counterexample": verdict.counterexample.describe()[:500] if verdict.counterexample else None,
                "timings": verdict.timings, "tolerances": verdict.tolerances,
                "seconds": round(time.perf_counter() - started, 2)}
    except Exception as error:  # noqa: BLE001 - a harness error is a result too
        return {"got": "harness-error", "detail": f"{type(error).__name__}: {error}"[:1500],
                "trace": traceback.format_exc()[-3000:], "seconds": round(time.perf_counter() - started, 2)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--groups", default="good,adversarial,committed,heldout")
    parser.add_argument("--timing", action="store_true", help="warm-worker timing alone and 4 in parallel")
    parser.add_argument("--bench", action="store_true", help="bench the good gelu kernel through the checked path")
    parser.add_argument("--only", nargs="*", default=[],
                        help="only kernels whose file name contains one of these (every group)")
    parser.add_argument("--timing-done", default=None, metavar="FILE",
                        help="touch FILE when the timing runs are over (other suites may start then)")
    args = parser.parse_args()
    results: dict = {"rows": [], "timing": {}}

    def save():
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")

    if args.timing:
        from specgen.verify.worker import VerifyWorker

        good = REPO / "tests" / "kernels" / "gelu_tanh.cu"
        worker = VerifyWorker()
        first = verify_one("gelu_tanh", good, False, worker)
        warm = verify_one("gelu_tanh", good, False, worker)
        results["timing"]["first"] = first
        results["timing"]["warm"] = warm
        worker.close()  # its cached GPU memory would crowd the verifications that follow
        save()
    if args.timing and not os.environ.get("VERIFY_NO_PARALLEL"):
        from specgen.verify.worker import VerifyWorker

        good = REPO / "tests" / "kernels" / "gelu_tanh.cu"
        workers = [VerifyWorker() for _ in range(4)]
        for w in workers:
            w.start()
        parallel: list = [None] * 4
        threads = [threading.Thread(target=lambda i=i: parallel.__setitem__(i, verify_one("gelu_tanh", good, False,
                                                                                            workers[i])))
                   for i in range(4)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results["timing"]["parallel4"] = {"wall_s": round(time.perf_counter() - started, 2),
                                          "each_s": [p["seconds"] for p in parallel],
                                          "reasons": [p["got"] for p in parallel], "details": parallel}
        for w in workers:
            w.close()
        save()
    if args.timing_done:
        Path(args.timing_done).touch()
    for group in filter(None, args.groups.split(",")):
        for spec_name, path, expect, sanitize in kernels(group):
            if args.only and not any(part in path.name for part in args.only):
                continue
            row = {"group": group, "kernel": path.name, "spec": spec_name, "expect": expect, "sanitize": sanitize}
            row.update(verify_one(spec_name, path, sanitize))
            ok = row["got"] == expect if expect != "rejected" else row["got"] not in ("passed", "harness-error")
            row["ok"] = ok
            results["rows"].append(row)
            print(f"{group:12} {path.name:44} expect {expect:22} got {row['got']:22} "
                  f"{'ok' if ok else 'NO'} {row['seconds']:.1f}s", flush=True)
            save()
    if args.bench:
        try:
            from specgen.bench import bench_spec
            from specgen.spec import load_spec
            from specgen.toolchain import compile_kernel
            from specgen.abi import write_header
            import tempfile

            spec = load_spec(REPO / "specs" / "gelu_tanh.yaml")
            with tempfile.TemporaryDirectory() as d:
                write_header(spec, d)
                lib = compile_kernel(REPO / "specs" / "kernels" / "gelu_tanh.cu", include_dirs=[Path(d)],
                                     name=spec.name).library
            result = bench_spec(spec, lib, directions=("forward", "backward"))
            results["bench"] = result.as_record()
            results["bench_rejected"] = result.rejected
        except Exception:  # noqa: BLE001
            results["bench_error"] = traceback.format_exc()[-3000:]
        save()
    print("\n== summary")
    for group in filter(None, args.groups.split(",")):
        rows = [r for r in results["rows"] if r["group"] == group]
        print(f"{group:12} {sum(r['ok'] for r in rows)}/{len(rows)} as expected")
    for key, value in results["timing"].items():
        print(f"timing {key}: {value.get('seconds', value) if isinstance(value, dict) else value}")
    if "bench" in results:
        for row in results["bench"]["rows"]:
            print(f"bench {row['direction']} {row['dtype']} {row['dims']}: kernel {row['kernel_us']} us eager "
                  f"{row['eager_us']} floor {row['floor_us']} rejected {row.get('rejected')}")
    if "bench_error" in results:
        print(results["bench_error"][-1500:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
