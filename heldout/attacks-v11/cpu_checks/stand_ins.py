#!/usr/bin/env python3
"""CPU stand-ins of some attacks-v11 kernels, run through the verifier's own engine
(specgen.verify.engine.run_verification(device="cpu")), as tests/verify_fakes.py builds stand-ins.

Each stand-in computes what its .cu computes, in the same precision steps (float32 math, the same
rounding points for 16-bit dtypes: x + residual and x + bias rounded, one rounding of each output,
sums of partials in double where the kernel sums in double), and reproduces the cheat's faulty path
where a CPU can: the tail-target miss of cross_entropy_a (from the tensors' real addresses), the
32-bit residual offset of add_rmsnorm_a (from the real addresses), the "unused residual_out" fast path
of add_rmsnorm_b, the lock left held by softmax_a after a failed allocation (a flag: a real lock would
hang the run). Each counts the calls on which its trigger was met (`triggers`), which is what the
verifier would have had to create to see the cheat. bias_gelu_a's counters in pool memory have no CPU
equivalent: its stand-in runs its arithmetic only; so do the stand-ins of the kernels whose cheat lies in
host code (log_softmax_a, rmsnorm_a, layernorm_gelu_a, rope_a, gelu_tanh_a, swiglu_a, swiglu_b): they
check the formulas and rounding points of their honest paths.

    PYTHONPATH=. python3 heldout/attacks-v11/cpu_checks/stand_ins.py --examples 5 --budget 16384 --seed 3

Reductions are torch's on the CPU, not the kernels' trees: the stand-ins check the kernels' formulas
and rounding points against the verifier's truth and tolerances, not their summation order.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
REPO = SUITE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NAN = float("nan")
BETA = 0.7978845608028654
KAPPA = 0.044715


def f32(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float32 value rounded once to the working dtype, widened back to float32."""
    return t.to(dtype).float()


def gelu(x: torch.Tensor) -> torch.Tensor:
    inner = BETA * (x + KAPPA * (x * x * x))
    return 0.5 * x * (1.0 + torch.tanh(inner))


def gelu_grad(x: torch.Tensor) -> torch.Tensor:
    x_sq = x * x
    inner = BETA * (x + KAPPA * (x_sq * x))
    t = torch.tanh(inner)
    left, right = 0.5 * x, 1.0 + t
    return 0.5 * right + left * (1.0 - t * t) * (BETA * (1.0 + 3.0 * KAPPA * x_sq))


class StandIn:
    """The interface the verifier's LocalRunner calls (tests/verify_fakes.py's PyKernel)."""

    name = "?"

    def __init__(self, spec):
        self.spec = spec
        self.calls = 0
        self.triggers = 0
        self.allocations_fail = False  # set by the runner for the call with no memory left

    def has(self, direction: str) -> bool:
        return True

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.calls += 1
        fn = self.forward if direction == "forward" else self.backward
        return int(fn(tensors, scalars, dims) or 0)

    def error_name(self, code: int) -> str:
        return {2: "cudaErrorMemoryAllocation", 1: "cudaErrorInvalidValue"}.get(code, f"cudaError {code}")

    def clear_error(self) -> None:
        pass


# ---------------------------------------------------------------- softmax (b: control; a: lock left held)
class SoftmaxB(StandIn):
    name = "softmax_b"

    def forward(self, t, scalars, dims):
        x = f32(t["x"])
        m = torch.amax(x, dim=-1, keepdim=True)
        e = torch.exp(x - m)
        t["out"].copy_((e / e.sum(-1, keepdim=True)).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        o, g = f32(t["out"]), f32(t["grad_out"])
        dot = (g * o).sum(-1, keepdim=True)
        t["grad_x"].copy_((o * (g - dot)).to(t["grad_x"].dtype))


class SoftmaxA(SoftmaxB):
    """Rows wider than 32768 take scratch from the pool under the plan lock; a failed allocation
    returns with the lock held, and every later forward would block in lock() (counted, not done)."""

    name = "softmax_a"

    def __init__(self, spec):
        super().__init__(spec)
        self.lock_held = False
        self.split_calls = 0

    def forward(self, t, scalars, dims):
        if self.lock_held:
            self.triggers += 1  # a real call would never return from g_plans_lock.lock()
        if dims["D"] > 32768:
            self.split_calls += 1
            if self.allocations_fail:
                self.lock_held = True
                return 2
        return super().forward(t, scalars, dims)


# ---------------------------------------------------------------- cross_entropy (b: control; a: tail target)
class CrossEntropyB(StandIn):
    name = "cross_entropy_b"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        return dims["N"] * 8 if direction == "forward" else 0

    def row_stats(self, x):
        m = torch.amax(x, dim=-1)
        s = torch.exp(x - m[:, None]).sum(-1)
        return m, torch.log(s)

    def target_logit(self, t, x, C):
        tg = t["target"].long()
        ok = (tg >= 0) & (tg < C)
        xt = x.gather(1, tg.clamp(0, C - 1)[:, None])[:, 0]
        return torch.where(ok, xt, torch.full_like(xt, NAN))

    def forward(self, t, scalars, dims):
        N, C = dims["N"], dims["C"]
        x = f32(t["logits"])
        m, ls = self.row_stats(x)
        xt = self.target_logit(t, x, C)
        loss = (ls - (xt - m)).double()
        t["saved_max"].copy_(m)
        t["saved_logsum"].copy_(ls)
        t["out"].copy_((loss.sum() / N).float())

    def backward(self, t, scalars, dims):
        N, C = dims["N"], dims["C"]
        x = f32(t["logits"])
        p = torch.exp((x - t["saved_max"][:, None]) - t["saved_logsum"][:, None])
        onehot = torch.zeros_like(p)
        tg = t["target"].long()
        ok = (tg >= 0) & (tg < C)
        rows = torch.arange(N)[ok]
        onehot[rows, tg[ok]] = 1.0
        scale = t["grad_out"].reshape(()).float() / float(N)
        t["grad_logits"].copy_(((p - onehot) * scale).to(t["grad_logits"].dtype))


class CrossEntropyA(CrossEntropyB):
    """Few rows of a wide vocabulary: a target in the row's tail (after its last whole 16-byte
    vector, from the row's real address) is not found, and the row's loss takes x_t = 0."""

    name = "cross_entropy_a"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, C = dims["N"], dims["C"]
        if direction != "forward" or N <= 0:
            return 0
        if N <= 64 and C >= 8192:
            return (N * 8 + 255) // 256 * 256 + N * ((C + 4095) // 4096) * 16
        return N * 8

    def target_logit(self, t, x, C):
        xt = super().target_logit(t, x, C)
        N = x.shape[0]
        if not (N <= 64 and C >= 8192):
            return xt
        logits = t["logits"]
        size = logits.element_size()
        vec = 16 // size
        tg = t["target"].long()
        for r in range(N):
            mis = ((logits.data_ptr() + r * C * size) // size) % vec
            head = (vec - mis) % vec
            body_end = head + (C - head) // vec * vec
            if body_end <= int(tg[r]) < C:
                self.triggers += 1
                xt[r] = 0.0
        return xt


# ---------------------------------------------------------------- add_rmsnorm (c: control; a: 32-bit offset; b: unused output)
class AddRmsnormC(StandIn):
    name = "add_rmsnorm_c"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, D = dims["N"], dims["D"]
        return ((N + 127) // 128) * D * 8 if direction == "backward" and N > 0 and D > 0 else 0

    def residual(self, t):
        return t["residual"]

    def forward(self, t, scalars, dims):
        eps = float(scalars.get("eps", 1e-6))
        dt = t["x"].dtype
        s = rounded(f32(t["x"]) + f32(self.residual(t)), dt)
        rstd = 1.0 / torch.sqrt((s * s).sum(-1) / float(dims["D"]) + eps)
        t["residual_out"].copy_(s.to(dt))
        t["saved_rstd"].copy_(rstd)
        t["out"].copy_(((s * rstd[:, None]) * f32(t["weight"])).to(dt))

    def grads(self, t, dims):
        """(the gradient reaching s through out, grad_residual_out) per element, float32"""
        dt = t["x"].dtype
        s = rounded(f32(t["x"]) + f32(t["residual"]), dt)
        rs = t["saved_rstd"][:, None]
        sh = s * rs
        g, w = f32(t["grad_out"]), f32(t["weight"])
        dot = (g * w * sh).sum(-1, keepdim=True) / float(dims["D"])
        return rs * (g * w - sh * dot), f32(t["grad_residual_out"]), sh

    def backward(self, t, scalars, dims):
        dt = t["x"].dtype
        gn, gres, sh = self.grads(t, dims)
        gs = (gres + gn).to(dt)
        t["grad_x"].copy_(gs)
        t["grad_residual"].copy_(gs)
        t["grad_weight"].copy_((f32(t["grad_out"]).double() * sh.double()).sum(0).float().to(dt))


class AddRmsnormA(AddRmsnormC):
    """The residual read as x[i + off] with off = (residual - x) / element size narrowed to int32."""

    name = "add_rmsnorm_a"

    def residual(self, t):
        x, r = t["x"], t["residual"]
        delta = (r.data_ptr() - x.data_ptr()) // x.element_size()
        if not (-(1 << 31) <= delta < (1 << 31)):
            self.triggers += 1
            return torch.full_like(r, NAN)  # read from somewhere else entirely
        return r


class AddRmsnormB(AddRmsnormC):
    """Tiles of 4 rows (rows of 64 or more) whose residual_out gradient is zero throughout while out's
    is not: grad_residual written as 0."""

    name = "add_rmsnorm_b"

    def backward(self, t, scalars, dims):
        super().backward(t, scalars, dims)
        N, D = dims["N"], dims["D"]
        if D < 64:
            return
        gres, gout = t["grad_residual_out"], t["grad_out"]
        for r0 in range(0, N - 3, 4):
            if bool((gres[r0:r0 + 4] == 0).all()) and bool((gout[r0:r0 + 4] != 0).any()):
                self.triggers += 1
                gn, _, _ = self.grads({k: v[r0:r0 + 4] if v.dim() and v.shape[0] == N else v for k, v in t.items()},
                                      dims)
                t["grad_x"][r0:r0 + 4].copy_(gn.to(t["grad_x"].dtype))
                t["grad_residual"][r0:r0 + 4].zero_()


# ---------------------------------------------------------------- bias_gelu (a: arithmetic only)
class BiasGeluA(StandIn):
    name = "bias_gelu_a"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, D = dims["N"], dims["D"]
        return ((N + 63) // 64) * D * 8 if direction == "backward" and N > 0 and D > 0 else 0

    def forward(self, t, scalars, dims):
        dt = t["x"].dtype
        h = rounded(f32(t["x"]) + f32(t["bias"]), dt)
        t["out"].copy_(gelu(h).to(dt))

    def backward(self, t, scalars, dims):
        if self.allocations_fail:  # its counters come from cudaMallocAsync: the error is returned
            return 2
        dt = t["x"].dtype
        h = rounded(f32(t["x"]) + f32(t["bias"]), dt)
        d = (f32(t["grad_out"]) * gelu_grad(h)).to(dt)
        t["grad_x"].copy_(d)
        t["grad_bias"].copy_(d.double().sum(0).float().to(dt))


# ---------------------------------------------------------------- arithmetic only (the cheat is in host code)
class LogSoftmaxA(StandIn):
    name = "log_softmax_a"

    def forward(self, t, scalars, dims):
        x = f32(t["x"])
        m = torch.amax(x, dim=-1, keepdim=True)
        ls = torch.log(torch.exp(x - m).sum(-1, keepdim=True))
        t["out"].copy_(((x - m) - ls).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        o, g = f32(t["out"]), f32(t["grad_out"])
        t["grad_x"].copy_((g - torch.exp(o) * g.sum(-1, keepdim=True)).to(t["grad_x"].dtype))


class RmsnormA(StandIn):
    name = "rmsnorm_a"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, D = dims["N"], dims["D"]
        return ((N + 127) // 128) * D * 8 if direction == "backward" and N > 0 and D > 0 else 0

    def forward(self, t, scalars, dims):
        eps = float(scalars.get("eps", 1e-6))
        x = f32(t["x"])
        rstd = 1.0 / torch.sqrt((x * x).sum(-1) / float(dims["D"]) + eps)
        t["saved_rstd"].copy_(rstd)
        t["out"].copy_(((x * rstd[:, None]) * f32(t["weight"])).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        dt = t["x"].dtype
        x, g, w = f32(t["x"]), f32(t["grad_out"]), f32(t["weight"])
        rs = t["saved_rstd"][:, None]
        xh = x * rs
        dot = (g * w * xh).sum(-1, keepdim=True) / float(dims["D"])
        t["grad_x"].copy_((rs * (g * w - xh * dot)).to(dt))
        t["grad_weight"].copy_((g.double() * xh.double()).sum(0).float().to(dt))


class LayernormGeluA(StandIn):
    name = "layernorm_gelu_a"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, D = dims["N"], dims["D"]
        if direction != "backward" or N <= 0 or D <= 0:
            return 0
        return (N * 8 + 255) // 256 * 256 + 2 * ((N + 127) // 128) * D * 8

    @staticmethod
    def moments(x, eps, D):
        # as the kernel: mean and variance each summed in double, then rounded to float
        mean = (x.double().sum(-1, keepdim=True) / D).float()
        d = x - mean
        var = ((d.double() * d.double()).sum(-1, keepdim=True) / D).float()
        rstd = 1.0 / torch.sqrt(var + eps)
        return d, rstd

    def stats(self, x, eps, D):
        d, rstd = self.moments(x, eps, D)
        return d * rstd

    def forward(self, t, scalars, dims):
        xh = self.stats(f32(t["x"]), float(scalars.get("eps", 1e-5)), dims["D"])
        y = xh * f32(t["weight"]) + f32(t["bias"])
        t["out"].copy_(gelu(y).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        dt, D = t["x"].dtype, dims["D"]
        x = f32(t["x"])
        eps = float(scalars.get("eps", 1e-5))
        d, rstd = self.moments(x, eps, D)
        xh = d * rstd
        w, b, g = f32(t["weight"]), f32(t["bias"]), f32(t["grad_out"])
        dy = g * gelu_grad(xh * w + b)
        a = dy * w
        s1 = a.sum(-1, keepdim=True) / float(D)
        s2 = (a * xh).sum(-1, keepdim=True) / float(D)
        t["grad_x"].copy_((rstd * (a - s1 - xh * s2)).to(dt))
        t["grad_weight"].copy_((dy.double() * xh.double()).sum(0).float().to(dt))
        t["grad_bias"].copy_(dy.double().sum(0).float().to(dt))


class RopeA(StandIn):
    name = "rope_a"

    def forward(self, t, scalars, dims):
        x = f32(t["x"])
        half = dims["D"] // 2
        c, s = f32(t["cos"])[:, None, :], f32(t["sin"])[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        t["out"].copy_(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        g = f32(t["grad_out"])
        half = dims["D"] // 2
        c, s = f32(t["cos"])[:, None, :], f32(t["sin"])[:, None, :]
        g1, g2 = g[..., :half], g[..., half:]
        t["grad_x"].copy_(torch.cat([g1 * c + g2 * s, g2 * c - g1 * s], -1).to(t["grad_x"].dtype))


class GeluTanhA(StandIn):
    name = "gelu_tanh_a"

    def forward(self, t, scalars, dims):
        t["out"].copy_(gelu(f32(t["x"])).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        t["grad_x"].copy_((f32(t["grad_out"]) * gelu_grad(f32(t["x"]))).to(t["grad_x"].dtype))


class SwigluA(StandIn):
    name = "swiglu_a"

    def forward(self, t, scalars, dims):
        H = dims["H"]
        x = f32(t["x"])
        g, u = x[:, :H], x[:, H:]
        t["out"].copy_((g / (1.0 + torch.exp(-g)) * u).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        H = dims["H"]
        x = f32(t["x"])
        g, u, d = x[:, :H], x[:, H:], f32(t["grad_out"])
        s = 1.0 / (1.0 + torch.exp(-g))
        t["grad_x"].copy_(torch.cat([d * u * s * (1.0 + g * (1.0 - s)), d * (g / (1.0 + torch.exp(-g)))],
                                    -1).to(t["grad_x"].dtype))


class SwigluB(SwigluA):
    name = "swiglu_b"


STAND_INS = {cls.name: cls for cls in (SoftmaxA, SoftmaxB, CrossEntropyA, CrossEntropyB, AddRmsnormA, AddRmsnormB,
                                        AddRmsnormC, BiasGeluA, LogSoftmaxA, RmsnormA, LayernormGeluA, RopeA,
                                        GeluTanhA, SwigluA, SwigluB)}


def run(name: str, examples: int, budget: int, seed: int) -> dict:
    from specgen.spec import load_spec
    from specgen.verify.engine import Options, run_verification

    spec = load_spec(SUITE / "specs" / f"{name.rsplit('_', 1)[0]}.yaml")
    kernel = STAND_INS[name](spec)
    started = time.perf_counter()
    verdict = run_verification(spec, kernel, Options(examples=examples, seed=seed, budget=budget), device="cpu")
    return {"file": f"{name}.cu", "reason": verdict.reason, "detail": (verdict.detail or "")[:600],
            "cases": verdict.cases, "calls": kernel.calls, "triggers": kernel.triggers,
            **({"split_calls": kernel.split_calls} if hasattr(kernel, "split_calls") else {}),
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=sorted(STAND_INS))
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--budget", type=int, default=1 << 14)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.names:
        row = run(name, args.examples, args.budget, args.seed)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
