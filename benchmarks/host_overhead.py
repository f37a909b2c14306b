"""Host time per call of an installed specgen package's ops beside the closest eager aten op(s),
at decode sizes: what a model pays per call when the GPU is not the bottleneck.

    python benchmarks/host_overhead.py --package specgen_kernels --out host_overhead.json

Host time per call = the wall time of a loop of K calls (default 1000) with one
torch.cuda.synchronize() at the end, divided by K, after a warm-up; the median of --repeats
loops; "torch.ops us" is the same call through torch.ops.<namespace>.<op> (no package wrapper).
Directions: forward (no autograd), and forward+backward (inputs that require grad, a
`.backward()` of the output's sum per call; the baseline does the same with its eager ops).
Ops: softmax, gelu_tanh, rmsnorm, swiglu, cross_entropy (those in specs/), bf16, [1..8 x 4096].
With --compile, also each call wrapped in torch.compile (forward only: the op as a graph).
The target (issue 13): ours <= 1.5x the eager baseline's host time. Exit 0 when measured
(whether or not the target holds: see the table), 3 without a CUDA GPU, 2 when the package
does not import.
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time

import torch

TARGET = 1.5
HIDDEN = 4096


def rms_norm_eager(x, w, eps=1e-6):
    """A hand-written RMSNorm in torch ops (as transformers' LlamaRMSNorm)."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def cases(pkg, rows: int, dtype) -> list[dict]:
    """(op, our call, [(baseline name, baseline call)], inputs maker) for each op the package has."""
    F = torch.nn.functional
    dev = "cuda"

    def x(*shape, grad=False):
        return lambda requires_grad: torch.randn(*shape, device=dev, dtype=dtype).requires_grad_(requires_grad and grad)

    out = []
    if hasattr(pkg, "softmax"):
        out.append({"op": "softmax", "ours": lambda a: pkg.softmax(a[0]), "inputs": [x(rows, HIDDEN, grad=True)],
                    "eager": [("torch.softmax", lambda a: torch.softmax(a[0], dim=-1))]})
    if hasattr(pkg, "gelu_tanh"):
        out.append({"op": "gelu_tanh", "ours": lambda a: pkg.gelu_tanh(a[0]), "inputs": [x(rows, HIDDEN, grad=True)],
                    "eager": [("F.gelu(tanh)", lambda a: F.gelu(a[0], approximate="tanh"))]})
    if hasattr(pkg, "rmsnorm"):
        eager = [("rmsnorm in torch ops", lambda a: rms_norm_eager(a[0], a[1]))]
        if hasattr(F, "rms_norm"):
            eager.append(("F.rms_norm", lambda a: F.rms_norm(a[0], (HIDDEN,), a[1], 1e-6)))
        out.append({"op": "rmsnorm", "ours": lambda a: pkg.rmsnorm(a[0], a[1]),
                    "inputs": [x(rows, HIDDEN, grad=True), x(HIDDEN, grad=True)], "eager": eager})
    if hasattr(pkg, "swiglu"):
        out.append({"op": "swiglu", "ours": lambda a: pkg.swiglu(a[0]), "inputs": [x(rows, 2 * HIDDEN, grad=True)],
                    "eager": [("F.silu(a)*b", lambda a: F.silu(a[0][:, :HIDDEN]) * a[0][:, HIDDEN:])]})
    if hasattr(pkg, "cross_entropy"):
        vocab = HIDDEN
        target = lambda requires_grad: torch.randint(0, vocab, (rows,), device=dev)  # noqa: E731
        out.append({"op": "cross_entropy", "ours": lambda a: pkg.cross_entropy(a[0], a[1]),
                    "inputs": [x(rows, vocab, grad=True), target],
                    "eager": [("F.cross_entropy", lambda a: F.cross_entropy(a[0], a[1]))]})
    return out


def host_us(fn, args, backward: bool, calls: int, repeats: int) -> float:
    """Median over `repeats` loops of `calls` calls (one sync each loop), in microseconds per call."""
    def once():
        result = fn(args)
        if backward:
            first = result[0] if isinstance(result, tuple) else result
            first.float().sum().backward()

    for _ in range(min(100, calls)):  # warm-up: caching allocator, lazy init, compiled graphs
        once()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            once()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def measure(pkg, rows_list, dtype, calls, repeats, compile_too) -> list[dict]:
    results = []
    for rows in rows_list:
        for case in cases(pkg, rows, dtype):
            for direction in ("forward", "forward+backward"):
                backward = direction == "forward+backward"
                args = [make(backward) for make in case["inputs"]]
                direct = getattr(getattr(pkg, "ops", None), case["op"], None)  # torch.ops, no Python wrapper
                with torch.set_grad_enabled(backward):
                    ours = host_us(case["ours"], args, backward, calls, repeats)
                    ours_ops = None if direct is None else host_us(lambda a: direct(*a), args, backward, calls, repeats)
                    eager = {name: host_us(fn, args, backward, calls, repeats) for name, fn in case["eager"]}
                    compiled = None
                    if compile_too and not backward:
                        torch._dynamo.reset()
                        fn = torch.compile(case["ours"], fullgraph=True, dynamic=False)
                        compiled = host_us(fn, args, backward, calls, repeats)
                closest = min(eager.values())
                results.append({"op": case["op"], "direction": direction, "rows": rows, "hidden": HIDDEN,
                                "dtype": str(dtype).replace("torch.", ""), "ours_us": ours, "ours_torch_ops_us": ours_ops,
                                "eager_us": eager,
                                "closest_eager_us": closest, "ratio": ours / closest,
                                "compiled_ours_us": compiled, "meets_target": ours / closest <= TARGET})
                print(f"{case['op']:14} {direction:17} rows={rows}: ours {ours:7.1f} us, eager "
                      + ", ".join(f"{n} {v:.1f}" for n, v in eager.items()), file=sys.stderr)
    return results


def print_table(results) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a specgen dependency
        for r in results:
            print(r)
        return
    table = Table(title=f"host time per call (us), target ours <= {TARGET}x the closest eager op")
    for column in ("op", "direction", "rows", "ours us", "torch.ops us", "eager us", "ratio", f"<= {TARGET}x",
                   "compiled us"):
        table.add_column(column, justify="left" if column in ("op", "direction", "eager us") else "right")
    for r in results:
        eager = ", ".join(f"{name} {us:.1f}" for name, us in r["eager_us"].items())
        direct = r.get("ours_torch_ops_us")
        table.add_row(r["op"], r["direction"], str(r["rows"]), f"{r['ours_us']:.1f}",
                      "-" if direct is None else f"{direct:.1f}", eager, f"{r['ratio']:.2f}x",
                      "yes" if r["meets_target"] else "NO",
                      "-" if r["compiled_ours_us"] is None else f"{r['compiled_ours_us']:.1f}")
    Console(width=160).print(table)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", default="specgen_kernels", help="an installed specgen package")
    parser.add_argument("--rows", default="1,8", help="comma-separated row counts (decode sizes)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--calls", type=int, default=1000, help="calls per timed loop (K)")
    parser.add_argument("--repeats", type=int, default=3, help="timed loops per row (the median is kept)")
    parser.add_argument("--compile", action="store_true", help="also time each op under torch.compile (forward)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_overhead: needs a CUDA GPU (host time per call is measured around CUDA launches)",
              file=sys.stderr)
        return 3
    try:
        pkg = importlib.import_module(args.package)
    except ImportError as error:
        print(f"host_overhead: cannot import {args.package}: {error}", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    rows = [int(r) for r in args.rows.split(",") if r]
    # the GPU alone while measuring (specgen's GPU lock): verifications sharing the machine wait
    from specgen.verify.gpulock import exclusive_gpu

    with exclusive_gpu(torch.cuda.current_device()):
        results = measure(pkg, rows, dtype, args.calls, args.repeats, args.compile)
    print_table(results)
    summary = {"package": args.package, "kernels_loaded": getattr(pkg, "CUDA_KERNELS_LOADED", None),
               "torch": torch.__version__, "device": torch.cuda.get_device_name(), "python": platform.python_version(),
               "calls": args.calls, "repeats": args.repeats, "target_ratio": TARGET,
               "all_meet_target": all(r["meets_target"] for r in results), "rows": results}
    if args.out:
        with open(args.out, "w") as out:
            json.dump(summary, out, indent=2)
    met = sum(r["meets_target"] for r in results)
    print(f"{met}/{len(results)} rows meet the target (ours <= {TARGET}x the closest eager op)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
