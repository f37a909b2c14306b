"""Model-level check of a built package: a small transformer block made of its ops.

The block (residual add + RMSNorm, rotary embedding, softmax attention, SwiGLU MLP,
LayerNorm + GELU, cross-entropy) runs three ways on the same weights and inputs:
through the package's ops eagerly, through them under `torch.compile(fullgraph=True)`, and
through the specs' reference functions. Loss and every gradient must match the reference.

    python scripts/model_check.py --package specgen_kernels --specs specs --out result.json
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

OPS = ["add_rmsnorm", "rope", "softmax", "swiglu", "layernorm_gelu", "cross_entropy"]


class ReferenceOps:
    """The specs' own reference functions, called like the package's ops."""

    def __init__(self, specs_dir: Path):
        from specgen.spec import load_spec

        for op in OPS:
            setattr(self, op, load_spec(specs_dir / f"{op}.yaml").reference_fn())


class PackageOps:
    """The package's ops, through torch.ops so the registered op (not a Python wrapper) runs."""

    def __init__(self, package: str):
        importlib.import_module(package)
        namespace = getattr(torch.ops, importlib.import_module(package).NAMESPACE)  # unique per build
        for op in OPS:
            setattr(self, op, getattr(namespace, op))


class Block(nn.Module):
    def __init__(self, ops, dim: int = 256, heads: int = 4, hidden: int = 512, vocab: int = 1000):
        super().__init__()
        self.ops, self.heads, self.head_dim = ops, heads, dim // heads
        self.norm1 = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.norm2 = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.ln_w = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.ln_b = nn.Parameter(0.1 * torch.randn(dim))
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.up = nn.Linear(dim, 2 * hidden)
        self.down = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x, residual, cos, sin, target):
        ops, S = self.ops, x.shape[0]
        h, res = ops.add_rmsnorm(x, residual, self.norm1, 1e-6)
        q, k, v = self.qkv(h).view(S, 3, self.heads, self.head_dim).unbind(1)
        q, k = ops.rope(q.contiguous(), cos, sin), ops.rope(k.contiguous(), cos, sin)
        scores = torch.einsum("shd,thd->hst", q, k) / math.sqrt(self.head_dim)
        probs = ops.softmax(scores.reshape(self.heads * S, S)).view(self.heads, S, S)
        attn = torch.einsum("hst,thd->shd", probs, v).reshape(S, -1)
        h2, res2 = ops.add_rmsnorm(self.proj(attn), res, self.norm2, 1e-6)
        mlp = self.down(ops.swiglu(self.up(h2)))
        y = ops.layernorm_gelu(mlp + res2, self.ln_w, self.ln_b, 1e-5)
        return ops.cross_entropy(self.head(y), target)


def run_block(block: Block, fn, inputs) -> tuple[float, dict[str, torch.Tensor]]:
    block.zero_grad(set_to_none=True)
    x = inputs["x"].clone().requires_grad_(True)
    loss = fn(x, inputs["residual"], inputs["cos"], inputs["sin"], inputs["target"])
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in block.named_parameters()}
    grads["x"] = x.grad.detach().clone()
    return loss.detach(), grads


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True)
    parser.add_argument("--specs", default="specs", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tolerance", type=float, default=2e-3, help="max relative error (float32)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("model check: needs a CUDA GPU", file=sys.stderr)
        return 3

    torch.manual_seed(0)
    S, dim, heads, vocab = 128, 256, 4, 1000
    half = dim // heads // 2
    angles = torch.arange(S)[:, None] * torch.exp(-math.log(10000.0) * torch.arange(half) / half)[None, :]
    inputs = {"x": torch.randn(S, dim), "residual": torch.randn(S, dim), "cos": angles.cos(), "sin": angles.sin(),
              "target": torch.randint(0, vocab, (S,))}
    inputs = {k: v.cuda() for k, v in inputs.items()}

    results, failures = {}, []
    reference_block = Block(ReferenceOps(args.specs), dim, heads, vocab=vocab).cuda()
    package_block = Block(PackageOps(args.package), dim, heads, vocab=vocab).cuda()
    package_block.load_state_dict(reference_block.state_dict())
    ref_loss, ref_grads = run_block(reference_block, reference_block, inputs)

    compiled = torch.compile(package_block, fullgraph=True)
    for mode, fn in [("eager", package_block), ("compile", compiled)]:
        start = time.perf_counter()
        loss, grads = run_block(package_block, fn, inputs)
        errors = {name: rel_error(grads[name], ref_grads[name]) for name in ref_grads}
        loss_error = rel_error(loss, ref_loss)
        worst = max(errors, key=errors.get)
        ok = loss_error <= args.tolerance and errors[worst] <= args.tolerance
        results[mode] = {"loss": loss.item(), "reference_loss": ref_loss.item(), "loss_rel_error": loss_error,
                         "grad_rel_errors": errors, "worst_grad": worst, "passed": ok,
                         "seconds": time.perf_counter() - start}
        if not ok:
            failures.append(mode)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    print(f"{'mode':<8} {'loss':>10} {'ref loss':>10} {'loss err':>10} {'worst grad err':>24} result")
    for mode, r in results.items():
        print(f"{mode:<8} {r['loss']:>10.5f} {r['reference_loss']:>10.5f} {r['loss_rel_error']:>10.2e} "
              f"{r['worst_grad']:>14} {r['grad_rel_errors'][r['worst_grad']]:>9.2e} "
              f"{'PASS' if r['passed'] else 'FAIL'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
