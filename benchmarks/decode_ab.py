"""Decode-size A/B of builtin kernel sources by device time: the profiler's kernel time per call
(no launch gaps), which is what a decode step pays on the GPU. CUDA events around one call of
a few-microsecond kernel also time the launch, and hid the few-rows problem in session 10.

    python benchmarks/decode_ab.py --out DIR --ops softmax,swiglu --sources committed,default,nofew \
        [--rows 1,8,32] [--hidden 4096] [--dtypes bfloat16,float32]

Sources: `committed` (specs/kernels/<op>.cu), `recorded` (the generator now, at the lock's
variant), or any variant name (benchmarks/variant_ab.py). Every source runs in this process
(ctypes) on the same inputs; each output is compared with the float64 truth as the verifier
compares (verify/compare.py: the spec's tolerances, widened by the reference's own error): a
sanity check of the A/B, not a verification (the verifier decides what ships). Session 11's
plain allclose flagged the committed kernels too (add_rmsnorm's grad_weight in bf16).
Shapes: the first input's leading dim = each of --rows, its last dim = --hidden (rope: S rows of
32 heads x 128). Writes DIR/decode_ab.json and prints a table (us per call, B/A).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from liger_ops import _device_time, _on_device  # noqa: E402
from variant_ab import compile_all, named, source_of  # noqa: E402
from specgen import abi  # noqa: E402
from specgen.fsutil import write_atomic  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify.compare import compare  # noqa: E402
from specgen.verify.data import prepare  # noqa: E402
from specgen.verify.library import KernelLibrary  # noqa: E402
from specgen.verify.strategies import make_case  # noqa: E402

CALLS = 200


def decode_dims(spec, rows: int, hidden: int) -> dict:
    if spec.name == "rope":
        return {"S": rows, "H": 32, "D": 128}
    first = spec.signature.inputs[0].type.dims
    dims = dict(spec.benchmark[0])
    dims[first[0].symbol] = rows
    dims[first[-1].symbol] = hidden  # swiglu's x: [N, 2*H]: H = hidden, as benchmarks/liger_ops.py
    return dims


def device_us_per_call(launch, calls: int = CALLS) -> float:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        launch()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            launch()
        torch.cuda.synchronize()
    return sum(_device_time(e) for e in prof.events() if _on_device(e)) / calls


def launcher_for(lib, data, direction: str):
    """(launch, outputs) for one prepared case: fresh output buffers and the workspace the kernel
    asks for, and a callable that launches it on the current stream (returns its error code)."""
    outs = {s.name: torch.empty(s.shape, dtype=s.dtype, device="cuda") for s in data.outputs}
    tensors = {**data.inputs, **outs}
    need = lib.workspace_bytes(direction, tensors, data.scalars, data.dims)
    if need:
        tensors[abi.WORKSPACE] = torch.empty(need, dtype=torch.uint8, device="cuda")
    return lib.launcher(direction, tensors, data.scalars, data.dims, torch.cuda.current_stream()), outs


def run_case(spec, libraries: dict, dims: dict, dtype: str, direction: str) -> dict:
    data = prepare(spec, make_case(dims, dtype, seed=0), direction, "cuda")
    row = {"op": spec.name, "direction": direction, "dims": dims, "dtype": dtype, "us": {}, "ok": {}}
    for name, lib in libraries.items():
        launch, outs = launcher_for(lib, data, direction)
        code = launch()
        torch.cuda.synchronize()
        if code:
            row["ok"][name] = f"error {lib.error_name(code)}"
            continue
        bad = [k for k, t in data.truth.items()
               if compare(outs[k], t, data.atol[k], data.rtol, data.reference.get(k)) is not None]
        row["ok"][name] = "ok" if not bad else "MISMATCH " + ",".join(bad)
        row["us"][name] = device_us_per_call(launch)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ops", required=True, help="op names of specs/, or spec paths (.yaml) from the repo root")
    parser.add_argument("--sources", default="committed,default")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("decode_ab: no CUDA GPU")
        return 3
    specs = [load_spec(REPO / op if op.endswith(".yaml") else REPO / "specs" / f"{op}.yaml")  # a name or a path
             for op in args.ops.split(",")]
    sources = named(args.sources)
    libs = compile_all({(s.name, v.name): (s, source_of(s, v)) for s in specs for v in sources})
    rows, a = [], sources[0].name
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        loaded = {v.name: KernelLibrary(spec, libs[(spec.name, v.name)]) for v in sources}
        directions = ("forward", "backward") if spec.backward == "kernel" else ("forward",)
        for r in map(int, args.rows.split(",")):
            for dtype in args.dtypes.split(","):
                for direction in directions:
                    row = run_case(spec, loaded, decode_dims(spec, r, args.hidden), dtype, direction)
                    rows.append(row)
                    cells = "  ".join(f"{n} {row['us'].get(n, float('nan')):6.2f}us {row['ok'][n]}"
                                      + (f" ({row['us'][n] / row['us'][a]:.2f}x)" if n != a and n in row['us']
                                         and a in row['us'] else "") for n in loaded)
                    print(f"{spec.name:15s} {direction:8s} rows={r:<3d} {dtype:9s} {cells}", flush=True)
                    write_atomic(args.out / "decode_ab.json", json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
