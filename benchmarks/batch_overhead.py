"""What leading batch dims (`x: Tensor[*B, D]`) cost per call: the public op of a batch group (a
CompositeImplicitAutograd in the compiled binding: check, fold, `<op>_rows`, unfold) on
[1, rows, D], beside its `<op>_rows` op on [rows, D] and eager torch ops on [1, rows, D], host
time per call at decode sizes; and its outputs and gradients on the GPU against the rows op.

    python benchmarks/batch_overhead.py --package specgen_batch --op rmsnorm_batched --out DIR

Host time per call as benchmarks/host_overhead.py measures it (a loop of calls, one sync).
Target (issue 13): the batched public op within 1.5x eager's host time, as every op.
Writes DIR/batch_overhead.json and prints a table.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_overhead import TARGET, host_us, rms_norm_eager  # noqa: E402

D = 4096


def agrees(public, rows_op, weight) -> dict:
    """The public op on [2, 3, D] against the rows op on [6, D]: outputs and gradients, bitwise."""
    x = torch.randn(2, 3, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x2 = x.detach().reshape(6, D).requires_grad_()
    w1, w2 = weight.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    y, y2 = public(x, w1), rows_op(x2, w2)
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g.reshape(6, D))
    return {"shape": list(y.shape), "output_equal": bool(torch.equal(y.reshape(6, D), y2)),
            "grad_x_equal": bool(torch.equal(x.grad.reshape(6, D), x2.grad)),
            "grad_weight_equal": bool(torch.equal(w1.grad, w2.grad))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", default="specgen_batch")
    parser.add_argument("--op", default="rmsnorm_batched")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("batch_overhead: no CUDA GPU")
        return 3
    pkg = importlib.import_module(args.package)
    ns = getattr(torch.ops, pkg._ops.NAMESPACE)
    public, rows_op = getattr(ns, args.op), getattr(ns, f"{args.op}_rows")  # the namespace is unique per build
    weight = torch.randn(D, device="cuda", dtype=torch.bfloat16)
    check = agrees(public, rows_op, weight)
    print(f"batched vs rows on the GPU: {check}", flush=True)
    results = []
    for rows in map(int, args.rows.split(",")):
        for backward in (False, True):
            def x3(rows=rows, backward=backward):
                return torch.randn(1, rows, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
            w = weight.detach().clone().requires_grad_(backward)
            a3, a2 = [x3(), w], [x3().detach().reshape(rows, D).requires_grad_(backward), w]
            with torch.set_grad_enabled(backward):
                us = {"package [1,rows,D]": host_us(lambda a: getattr(pkg, args.op)(*a), a3, backward,
                                                    args.calls, args.repeats),
                      "torch.ops public [1,rows,D]": host_us(lambda a: public(*a), a3, backward, args.calls,
                                                             args.repeats),
                      "torch.ops _rows [rows,D]": host_us(lambda a: rows_op(*a), a2, backward, args.calls,
                                                          args.repeats),
                      "eager rms_norm [1,rows,D]": host_us(lambda a: rms_norm_eager(*a), a3, backward,
                                                           args.calls, args.repeats)}
            ratio = us["package [1,rows,D]"] / us["eager rms_norm [1,rows,D]"]
            results.append({"rows": rows, "direction": "forward+backward" if backward else "forward", "us": us,
                            "ratio_to_eager": ratio, "meets_target": ratio <= TARGET})
            print(f"rows={rows} {'fwd+bwd' if backward else 'forward'}: "
                  + ", ".join(f"{k} {v:.1f} us" for k, v in us.items()) + f"  ratio {ratio:.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batch_overhead.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                                              "torch": torch.__version__, "agrees": check,
                                                              "rows": results}, indent=1))
    return 0 if all(check[k] for k in check if k.endswith("_equal")) else 1


if __name__ == "__main__":
    sys.exit(main())
