"""Where a decode-size call's device time goes: every kernel one call launches, with its grid,
block, cluster, registers and shared memory (the profiler's trace), for our kernel sources beside
torch's own op and Liger-Kernel's (when installed), at a few rows of `--hidden`.

    python benchmarks/decode_profile.py --out DIR [--op softmax] [--rows 1,8] [--dtypes bfloat16,float32] \
        [--sources committed,nofew,fewblock]

Session 12 left softmax forward at 3.2-3.3 us per call at 8 x 4096 in both few-row forms (Liger
1.6 us): this says whether that is one slow kernel, a second launch, or the launch shape, before
another schedule is written. Writes DIR/decode_profile.json and prints one line per kernel.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from decode_ab import decode_dims, launcher_for  # noqa: E402
from variant_ab import compile_all, named, source_of  # noqa: E402
from specgen.fsutil import write_atomic  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify.data import prepare  # noqa: E402
from specgen.verify.library import KernelLibrary  # noqa: E402
from specgen.verify.strategies import make_case  # noqa: E402

CALLS = 100
PEERS = {  # op -> (torch's eager op, Liger's module and Function) on the first input
    "softmax": (lambda x: torch.softmax(x, -1), ("softmax", "LigerSoftmaxFunction")),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), None),
}


def kernels_per_call(launch, calls: int = CALLS) -> list[dict]:
    """The kernels of `calls` calls from the profiler's chrome trace, averaged per distinct kernel."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        launch()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            launch()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    found = defaultdict(list)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            found[e.get("name", "?")].append(e)
    rows = []
    for name, group in found.items():
        args = group[0].get("args", {})
        rows.append({"kernel": name[:120], "per_call": len(group) / calls,
                     "us_each": sum(e.get("dur", 0) for e in group) / len(group),
                     "us_per_call": sum(e.get("dur", 0) for e in group) / calls,
                     **{k: args.get(k) for k in ("grid", "block", "cluster", "registers per thread",
                                                 "shared memory", "est. achieved occupancy %")}})
    return rows


def ours(spec, lib, dims, dtype):
    data = prepare(spec, make_case(dims, dtype, seed=0), "forward", "cuda")
    return launcher_for(lib, data, "forward")[0], data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--op", default="softmax")
    parser.add_argument("--sources", default="committed,nofew,fewblock")
    parser.add_argument("--plain", action="store_true",
                        help="launch each candidate 5 times with no profiler (under ncu, which owns CUPTI)")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("decode_profile: no CUDA GPU")
        return 3
    spec = load_spec(REPO / "specs" / f"{args.op}.yaml")
    sources = named(args.sources)
    libs = compile_all({(spec.name, v.name): (spec, source_of(spec, v)) for v in sources})
    loaded = {v.name: KernelLibrary(spec, libs[(spec.name, v.name)]) for v in sources}
    eager, liger_at = PEERS.get(spec.name, (None, None))
    liger = None
    if liger_at:
        try:
            import importlib
            liger = getattr(importlib.import_module(f"liger_kernel.ops.{liger_at[0]}"), liger_at[1])
        except Exception as error:  # Liger not carried: ours and torch's only
            print(f"decode_profile: no Liger ({error})", file=sys.stderr)
    results = []
    args.out.mkdir(parents=True, exist_ok=True)
    for rows in map(int, args.rows.split(",")):
        for dtype in args.dtypes.split(","):
            dims = decode_dims(spec, rows, args.hidden)
            launches = {}
            for name, lib in loaded.items():
                launches[f"ours:{name}"], data = ours(spec, lib, dims, dtype)
            first = next(iter(data.inputs.values()))
            if eager:
                launches["torch"] = lambda x=first: eager(x)
            if liger:
                launches["liger"] = lambda x=first: liger.apply(x)
            for who, launch in launches.items():
                if args.plain:
                    for _ in range(5):
                        launch()
                    torch.cuda.synchronize()
                    print(f"{spec.name} rows={rows} {dtype:9s} {who:16s} launched 5 times", flush=True)
                    continue
                kernels = kernels_per_call(launch)
                total = sum(k["us_per_call"] for k in kernels)
                results.append({"op": spec.name, "rows": rows, "hidden": args.hidden, "dtype": dtype,
                                "who": who, "us_per_call": total, "kernels": kernels})
                print(f"{spec.name} rows={rows} {dtype:9s} {who:16s} {total:6.2f} us/call", flush=True)
                for k in kernels:
                    print(f"    {k['per_call']:.1f}x {k['us_each']:6.2f} us  grid={k['grid']} block={k['block']} "
                          f"cluster={k['cluster']} regs={k['registers per thread']} smem={k['shared memory']} "
                          f"occ={k['est. achieved occupancy %']}  {k['kernel'][:70]}", flush=True)
                write_atomic(args.out / "decode_profile.json", json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
