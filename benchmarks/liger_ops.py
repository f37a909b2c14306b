"""Device time of an installed specgen package's ops beside Liger-Kernel's, eager PyTorch's and
torch.compile's, in one run: issue 13's op-level comparison.

    python benchmarks/liger_ops.py --package specgen_kernels --out liger_ops.json \
        [--ops rmsnorm,softmax] [--shapes 16384x4096,4096x8192,8x4096] [--dtypes bfloat16,float32]

Device time = the profiler's GPU time of every kernel, memset and memcpy a step launches
(no launch gaps), per step, over --steps steps after a warm-up; the JSON keeps each
candidate's eight longest device activities per row (what a decode-size step is made of). A step is the forward, or the
forward and the backward of it (`torch.autograd.backward` with a fixed output gradient).
Ops (each only when the package has it): rmsnorm, add_rmsnorm (Liger's fused add + RMSNorm),
swiglu ([N, 2H] -> [N, H]; Liger's fused gate-up SiLU-mul), softmax, cross_entropy (N x vocab,
mean loss), rope ([S, H, 128] for ours; Liger rotates q and k in one launch, so ours is timed
on both as two calls). Shapes are rows x hidden; rope takes hidden / 128 heads.
Target (issue 13): ours no slower than Liger and torch.compile on every row (3% noise allowed).
Exit 0 when measured, 3 without a CUDA GPU, 2 when the package does not import.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specgen.fsutil import write_atomic  # noqa: E402

NOISE = 1.03
HEAD_DIM = 128
DEFAULT_SHAPES = "16384x4096,4096x8192,8x4096"
DEFAULT_OPS = "rmsnorm,add_rmsnorm,swiglu,softmax,cross_entropy,rope"


def rms_norm_eager(x, w, eps=1e-6):
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_eager(x, cos, sin):
    """specs/rope.yaml's reference: x [S, H, D], cos/sin [S, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _liger(module: str, name: str):
    try:
        return getattr(importlib.import_module(f"liger_kernel.ops.{module}"), name)
    except Exception:  # Liger not installed, or this version lacks the op
        return None


def cases(pkg, op: str, rows: int, hidden: int, dtype, dev: str = "cuda") -> dict | None:
    """{"inputs": [make(requires_grad)], "candidates": {name: fn(args) -> outputs}} for one op and
    shape, or None when the package lacks the op. Every candidate computes the same function."""
    if not hasattr(pkg, op):
        return None
    F = torch.nn.functional
    ours = getattr(pkg, op)

    def t(*shape, grad=True, scale=1.0):
        return lambda g: (torch.randn(*shape, device=dev, dtype=dtype) * scale).requires_grad_(g and grad)

    if op == "rmsnorm":
        rms = _liger("rms_norm", "LigerRMSNormFunction")
        return {"inputs": [t(rows, hidden), t(hidden)],
                "candidates": {"ours": lambda a: ours(a[0], a[1]), "eager": lambda a: rms_norm_eager(a[0], a[1]),
                               "liger": rms and (lambda a: rms.apply(a[0], a[1], 1e-6, 0.0, "llama", False))}}
    if op == "add_rmsnorm":
        fused = _liger("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")

        def eager(a):
            s = a[0] + a[1]
            return rms_norm_eager(s, a[2]), s
        return {"inputs": [t(rows, hidden), t(rows, hidden), t(hidden)],
                "candidates": {"ours": lambda a: ours(a[0], a[1], a[2]), "eager": eager,
                               "liger": fused and (lambda a: fused.apply(a[0], a[1], a[2], 1e-6))}}
    if op == "swiglu":
        gate_up = _liger("swiglu", "LigerFusedGateUpSiLUMulFunction")
        return {"inputs": [t(rows, 2 * hidden)],
                "candidates": {"ours": lambda a: ours(a[0]),
                               "eager": lambda a: F.silu(a[0][:, :hidden]) * a[0][:, hidden:],
                               "liger": gate_up and (lambda a: gate_up.apply(a[0]))}}
    if op == "softmax":
        soft = _liger("softmax", "LigerSoftmaxFunction")
        return {"inputs": [t(rows, hidden)],
                "candidates": {"ours": lambda a: ours(a[0]), "eager": lambda a: torch.softmax(a[0], dim=-1),
                               "liger": soft and (lambda a: soft.apply(a[0]))}}
    if op == "cross_entropy":
        ce = _liger("cross_entropy", "LigerCrossEntropyFunction")
        target = lambda g: torch.randint(0, hidden, (rows,), device=dev)  # noqa: E731
        return {"inputs": [t(rows, hidden), target],
                "candidates": {"ours": lambda a: ours(a[0], a[1]), "eager": lambda a: F.cross_entropy(a[0].float(), a[1]),
                               "liger": ce and (lambda a: ce.apply(a[0], a[1], None)[0])}}
    if op == "rope":
        heads = max(1, hidden // HEAD_DIM)
        liger_rope = _liger("rope", "LigerRopeFunction")
        half = lambda g: torch.randn(rows, HEAD_DIM // 2, device=dev, dtype=dtype)  # noqa: E731
        qk = t(rows, heads, HEAD_DIM)

        def liger(a):  # Liger's layout: q, k [1, H, S, D], cos/sin [1, S, D] (halves repeated)
            cos, sin = (torch.cat([c, c], -1).unsqueeze(0) for c in (a[2], a[3]))
            return liger_rope.apply(a[4], a[5], cos, sin)
        return {"inputs": [qk, qk, half, half, t(1, heads, rows, HEAD_DIM), t(1, heads, rows, HEAD_DIM)],
                "candidates": {"ours": lambda a: (ours(a[0], a[2], a[3]), ours(a[1], a[2], a[3])),
                               "eager": lambda a: (rope_eager(a[0], a[2], a[3]), rope_eager(a[1], a[2], a[3])),
                               "liger": liger_rope and liger}}
    raise ValueError(f"--ops: no case for {op!r}; ops: {DEFAULT_OPS}")


def _outputs(result) -> list:
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [o for o in items if isinstance(o, torch.Tensor) and o.requires_grad]


def device_us(fn, args, backward: bool, steps: int, kernels: dict | None = None) -> float:
    """GPU time per step (kernels, memsets, copies; no gaps) from the profiler, in microseconds;
    `kernels` (when given) gets each device activity's name -> microseconds per step.
    Liger's rope rotates in place: each step gets fresh clones of the inputs (outside the time)."""
    from torch.profiler import ProfilerActivity, profile

    def step(fresh):
        outs = fn(fresh)
        if backward:
            tensors = _outputs(outs)
            torch.autograd.backward(tensors, [torch.ones_like(o) for o in tensors])

    def clones():
        return [a.detach().clone().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in args]

    for _ in range(3):
        step(clones())
    torch.cuda.synchronize()
    prepared = [clones() for _ in range(steps)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for fresh in prepared:
            step(fresh)
        torch.cuda.synchronize()
    device = [e for e in prof.events() if _on_device(e)]
    if kernels is not None:
        for e in device:
            kernels[e.name[:120]] = kernels.get(e.name[:120], 0.0) + _device_time(e) / steps
    return sum(_device_time(e) for e in device) / steps


def _on_device(event) -> bool:
    kind = getattr(event, "device_type", None)
    return kind is not None and "CUDA" in str(kind)


def _device_time(event) -> float:
    for name in ("device_time", "cuda_time"):
        value = getattr(event, name, None)
        if value:
            return float(value)
    return 0.0


def verdict(us: dict) -> str:
    ours = us.get("ours")
    if not ours:
        return "not measured"
    slower = [name for name in ("liger", "compile") if us.get(name) and ours > NOISE * us[name]]
    return "ok" if not slower else "SLOWER than " + " and ".join(slower)


def measure(pkg, ops: list[str], shapes: list[tuple[int, int]], dtypes: list, steps: int,
            on_row=lambda rows: None) -> list[dict]:
    """Every row; `on_row(rows so far)` after each (the JSON is rewritten: a cut run keeps its rows)."""
    rows = []
    for op in ops:
        for n, hidden in shapes:
            for dtype in dtypes:
                case = cases(pkg, op, n, hidden, dtype)
                if case is None:
                    continue
                for direction in ("forward", "forward+backward"):
                    backward = direction == "forward+backward"
                    args = [make(backward) for make in case["inputs"]]
                    candidates = {k: v for k, v in case["candidates"].items() if v is not None}
                    torch._dynamo.reset()
                    candidates["compile"] = torch.compile(case["candidates"]["eager"], dynamic=False)
                    us, kernels = {}, {}
                    for name, fn in candidates.items():
                        try:
                            with torch.set_grad_enabled(backward):
                                kernels[name] = {}
                                us[name] = device_us(fn, args, backward, steps, kernels[name])
                        except Exception as error:  # one candidate failing is a row note, not an abort
                            us[name] = None
                            print(f"[liger_ops] {op} {n}x{hidden} {dtype} {direction} {name}: {error}", file=sys.stderr)
                    row = {"op": op, "shape": f"{n}x{hidden}", "dtype": str(dtype).replace("torch.", ""),
                           "direction": direction, "us": us, "verdict": verdict(us),
                           "kernels": {k: dict(sorted(v.items(), key=lambda kv: -kv[1])[:8]) for k, v in kernels.items()}}
                    rows.append(row)
                    on_row(rows)
                    print(line(row), flush=True)
    return rows


def line(row: dict) -> str:
    us = row["us"]
    cells = [f"{name} {us[name]:.1f}" if us.get(name) else f"{name} -" for name in ("ours", "liger", "compile", "eager")]
    return f"{row['op']:13} {row['direction']:16} {row['shape']:>10} {row['dtype']:8} " + "  ".join(cells) \
        + f"  {row['verdict']}"


def table(rows: list[dict]) -> str:
    out = ["| op | direction | shape | dtype | ours us | Liger us | compile us | eager us | x Liger | x compile | verdict |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        us = r["us"]

        def cell(name):
            return f"{us[name]:.1f}" if us.get(name) else "-"

        def ratio(name):
            return f"{us[name] / us['ours']:.2f}" if us.get(name) and us.get("ours") else "-"
        out.append(f"| {r['op']} | {r['direction']} | {r['shape']} | {r['dtype']} | {cell('ours')} | {cell('liger')} | "
                   f"{cell('compile')} | {cell('eager')} | {ratio('liger')} | {ratio('compile')} | {r['verdict']} |")
    ok = sum(r["verdict"] == "ok" for r in rows)
    out.append(f"\n{ok}/{len(rows)} rows: ours no slower than Liger and torch.compile (x: their time / ours)")
    return "\n".join(out)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    try:
        return [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        raise SystemExit(f"--shapes: {text!r}: write ROWSxHIDDEN,... e.g. {DEFAULT_SHAPES}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", default="specgen_kernels")
    parser.add_argument("--out", type=Path, default=Path("liger_ops.json"))
    parser.add_argument("--ops", default=DEFAULT_OPS)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    if not torch.cuda.is_available():
        print("liger_ops: no CUDA GPU", file=sys.stderr)
        return 3
    try:
        pkg = importlib.import_module(args.package)
    except Exception as error:
        print(f"liger_ops: cannot import {args.package}: {error}", file=sys.stderr)
        return 2
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    liger = importlib.util.find_spec("liger_kernel")
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
              "liger_kernel": importlib.metadata.version("liger_kernel") if liger else None,
              "package": args.package, "steps": args.steps}

    def write(rows):
        ratios = [r["us"]["ours"] / r["us"]["liger"] for r in rows if r["us"].get("ours") and r["us"].get("liger")]
        report = {**header, "rows": rows, "median_ours_over_liger": statistics.median(ratios) if ratios else None}
        write_atomic(args.out, json.dumps(report, indent=1))

    rows = measure(pkg, args.ops.split(","), shapes, dtypes, args.steps, on_row=write)
    write(rows)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
