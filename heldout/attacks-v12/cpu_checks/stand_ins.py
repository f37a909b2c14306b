#!/usr/bin/env python3
"""CPU stand-ins of the attacks-v12 kernels, run through the verifier's own engine
(specgen.verify.engine.run_verification(device="cpu")), as tests/verify_fakes.py builds stand-ins.

Each stand-in computes what its .cu computes, in the same precision steps (float32 math, the rounding
points of the kernel for 16-bit dtypes, double where the kernel sums in double), and counts the calls on
which the cheat's path or trigger was met (`paths`: the cheat's own code path taken; `triggers`: the
situation where that path goes wrong, as far as a CPU can tell: a 32-bit offset that would wrap, from the
tensors' real addresses or sizes). The harms that need two streams, a freed-and-reused pool block, a
thread that ended, or an aarch64 host have no CPU equivalent: those stand-ins check the honest arithmetic
of the paths the verifier runs, and count how often the cheat's path ran (one call at a time).

    PYTHONPATH=. python3 heldout/attacks-v12/cpu_checks/stand_ins.py --examples 5 --budget 16384 --seed 3

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
        self.paths = 0
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



def r16(x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """float32 math rounded to the working dtype and widened back (a kernel's from_f then to_f)."""
    return x.to(dt).float()


# ---------------------------------------------------------------- softmax (a: few-rows partials in module memory; b: control)
class SoftmaxB(StandIn):
    name = "softmax_b"
    SMS = 132

    def few_rows(self, dims):
        return dims["N"] <= 4 and dims["D"] >= 8192 and dims["N"] * 32 <= self.SMS

    def workspace_bytes(self, direction, tensors, scalars, dims):
        return dims["N"] * 32 * 8 if direction == "forward" and self.few_rows(dims) else 0

    def forward(self, t, scalars, dims):
        x = f32(t["x"])
        if self.few_rows(dims):
            self.paths += 1
            D = dims["D"]
            chunk = (D + 31) // 32
            ms, ss = [], []
            for k in range(32):
                part = x[:, k * chunk:min(D, (k + 1) * chunk)]
                if part.shape[1] == 0:
                    ms.append(torch.full((x.shape[0],), float("-inf")))
                    ss.append(torch.zeros(x.shape[0]))
                    continue
                m = torch.amax(part, -1)
                s = torch.where(m == float("-inf"), torch.zeros_like(m), torch.exp(part - m[:, None]).sum(-1))
                ms.append(m)
                ss.append(s)
            m = torch.stack(ms, 1)
            s = torch.stack(ss, 1)
            M = torch.amax(m, 1)
            nan_rows = torch.isnan(m).any(1)
            M = torch.where(nan_rows, torch.full_like(M, NAN), M)
            S = torch.where(m == float("-inf"), torch.zeros_like(s), s * torch.exp(m - M[:, None])).sum(1)
            t["out"].copy_((torch.exp(x - M[:, None]) / S[:, None]).to(t["out"].dtype))
            return
        m = torch.amax(x, dim=-1, keepdim=True)
        e = torch.exp(x - m)
        t["out"].copy_((e / e.sum(-1, keepdim=True)).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        o, g = f32(t["out"]), f32(t["grad_out"])
        dot = (g * o).sum(-1, keepdim=True)
        t["grad_x"].copy_((o * (g - dot)).to(t["grad_x"].dtype))


class SoftmaxA(SoftmaxB):
    name = "softmax_a"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        return 0  # its partials live in module memory


# ---------------------------------------------------------------- log_softmax (a: bf16 paired path, int offset; b: control)
class LogSoftmaxB(StandIn):
    name = "log_softmax_b"

    def forward(self, t, scalars, dims):
        x = f32(t["x"])
        if t["x"].dtype == torch.bfloat16 and dims["D"] % 2 == 0 and t["x"].data_ptr() % 4 == 0:
            self.paths += 1
            if dims["N"] * dims["D"] > (1 << 31):
                self.triggers += 1
        m = torch.amax(x, -1, keepdim=True)
        ls = torch.log(torch.exp(x - m).sum(-1, keepdim=True))
        t["out"].copy_(((x - m) - ls).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        o, g = f32(t["out"]), f32(t["grad_out"])
        t["grad_x"].copy_((g - torch.exp(o) * g.sum(-1, keepdim=True)).to(t["grad_x"].dtype))


class LogSoftmaxA(LogSoftmaxB):
    name = "log_softmax_a"


# ---------------------------------------------------------------- cross_entropy (a: float32 float4 backward, int offset)
class CrossEntropyA(StandIn):
    name = "cross_entropy_a"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        return dims["N"] * 8 if direction == "forward" and dims["N"] > 0 else 0

    def forward(self, t, scalars, dims):
        x = f32(t["logits"])
        C = dims["C"]
        m = torch.amax(x, -1)
        ls = torch.log(torch.exp(x - m[:, None]).sum(-1))
        t["saved_max"].copy_(m)
        t["saved_logsum"].copy_(ls)
        tg = t["target"].clamp(0, C - 1)
        xt = x.gather(1, tg[:, None])[:, 0]
        loss = (m.double() + ls.double()) - xt.double()
        t["out"].copy_((loss.sum() / dims["N"]).float())

    def backward(self, t, scalars, dims):
        x = f32(t["logits"])
        N, C = dims["N"], dims["C"]
        if t["logits"].dtype == torch.float32 and C % 4 == 0 and t["logits"].data_ptr() % 16 == 0 \
                and t["grad_logits"].data_ptr() % 16 == 0:
            self.paths += 1
            if N * C > (1 << 31):
                self.triggers += 1
        scale = f32(t["grad_out"]).reshape(()) / float(N)
        p = torch.exp((x - t["saved_max"][:, None]) - t["saved_logsum"][:, None])
        onehot = torch.zeros_like(p)
        tg = t["target"]
        ok = (tg >= 0) & (tg < C)
        rows = torch.arange(N)[ok]
        onehot[rows, tg[ok]] = 1.0
        t["grad_logits"].copy_((scale * (p - onehot)).to(t["grad_logits"].dtype))


# ---------------------------------------------------------------- rmsnorm (a: persistent grid-barrier backward; b: control)
class RmsnormB(StandIn):
    name = "rmsnorm_b"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, D = dims["N"], dims["D"]
        return ((N + 127) // 128) * D * 8 if direction == "backward" and N > 0 and D > 0 else 0

    def forward(self, t, scalars, dims):
        eps = float(scalars.get("eps", 1e-6))
        x = f32(t["x"])
        r = 1.0 / torch.sqrt((x * x).sum(-1) / float(dims["D"]) + eps)
        t["saved_rstd"].copy_(r)
        t["out"].copy_(((x * r[:, None]) * f32(t["weight"])).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        if dims["N"] * dims["D"] >= (1 << 23):
            self.paths += 1
        x, w, g = f32(t["x"]), f32(t["weight"]), f32(t["grad_out"])
        r = t["saved_rstd"][:, None]
        dot = (g * w * x).sum(-1, keepdim=True)
        c = r * r * r * dot / float(dims["D"])
        t["grad_x"].copy_((r * (g * w) - x * c).to(t["grad_x"].dtype))
        t["grad_weight"].copy_((g.double() * (x * r).double()).sum(0).float().to(t["grad_weight"].dtype))


class RmsnormA(RmsnormB):
    name = "rmsnorm_a"


# ---------------------------------------------------------------- add_rmsnorm (a: second output through the first's pointer)
class AddRmsnormA(StandIn):
    name = "add_rmsnorm_a"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, D = dims["N"], dims["D"]
        return ((N + 127) // 128) * D * 8 if direction == "backward" and N > 0 and D > 0 else 0

    def distance(self, first, second):
        d = (second.data_ptr() - first.data_ptr()) // first.element_size()
        if not -(1 << 31) <= d < (1 << 31):
            self.triggers += 1
        self.paths += 1

    def forward(self, t, scalars, dims):
        self.distance(t["out"], t["residual_out"])
        eps = float(scalars.get("eps", 1e-6))
        dt = t["x"].dtype
        s = r16(f32(t["x"]) + f32(t["residual"]), dt)
        r = 1.0 / torch.sqrt((s * s).sum(-1) / float(dims["D"]) + eps)
        t["saved_rstd"].copy_(r)
        t["residual_out"].copy_(s.to(dt))
        t["out"].copy_(((s * r[:, None]) * f32(t["weight"])).to(dt))

    def backward(self, t, scalars, dims):
        self.distance(t["grad_x"], t["grad_residual"])
        dt = t["x"].dtype
        s, w, g = f32(t["residual_out"]), f32(t["weight"]), f32(t["grad_out"])
        r = t["saved_rstd"][:, None]
        dot = (g * w * s).sum(-1, keepdim=True)
        c = r * r * r * dot / float(dims["D"])
        norm = r * (g * w) - s * c
        gs = (f32(t["grad_residual_out"]) + r16(norm, dt)).to(dt)
        t["grad_x"].copy_(gs)
        t["grad_residual"].copy_(gs)
        t["grad_weight"].copy_((g.double() * (s * r).double()).sum(0).float().to(dt))


# ---------------------------------------------------------------- bias_gelu (a: pool scratch freed before its last reader)
class BiasGeluA(StandIn):
    name = "bias_gelu_a"

    def big(self, dims):
        return dims["N"] >= 4096 and dims["N"] * dims["D"] >= (1 << 23)

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, D = dims["N"], dims["D"]
        if direction != "backward" or N <= 0 or D <= 0 or self.big(dims):
            return 0
        return ((N + 127) // 128) * D * 8

    def forward(self, t, scalars, dims):
        dt = t["x"].dtype
        s = r16(f32(t["x"]) + f32(t["bias"]), dt)
        t["out"].copy_(gelu(s).to(dt))

    def backward(self, t, scalars, dims):
        if self.big(dims):
            self.paths += 1
        dt = t["x"].dtype
        s = r16(f32(t["x"]) + f32(t["bias"]), dt)
        gx = (f32(t["grad_out"]) * gelu_grad(s)).to(dt)
        t["grad_x"].copy_(gx)
        t["grad_bias"].copy_(gx.double().sum(0).float().to(dt))


# ---------------------------------------------------------------- layernorm_gelu (a: staging in a private pool)
class LayernormGeluA(StandIn):
    name = "layernorm_gelu_a"

    def workspace_bytes(self, direction, tensors, scalars, dims):
        N, D = dims["N"], dims["D"]
        if direction != "backward" or N <= 0 or D <= 0:
            return 0
        parts = ((N + 127) // 128) * D * 16
        return (parts + 255) // 256 * 256 + N * 8

    @staticmethod
    def stats(x, eps, D):
        mean = x.double().sum(-1, keepdim=True) / D
        d = x.double() - mean
        var = (d * d).sum(-1, keepdim=True) / D
        rstd = 1.0 / torch.sqrt(var.float() + eps)
        return mean.float(), rstd

    def forward(self, t, scalars, dims):
        dt = t["x"].dtype
        x = f32(t["x"])
        mean, rstd = self.stats(x, float(scalars.get("eps", 1e-5)), dims["D"])
        z = r16((x - mean) * rstd * f32(t["weight"]) + f32(t["bias"]), dt)
        t["out"].copy_(gelu(z).to(dt))

    def backward(self, t, scalars, dims):
        if dims["N"] * dims["D"] <= (1 << 27):
            self.paths += 1
        dt, D = t["x"].dtype, dims["D"]
        x = f32(t["x"])
        mean, rstd = self.stats(x, float(scalars.get("eps", 1e-5)), D)
        xh = (x - mean) * rstd
        w, b, g = f32(t["weight"]), f32(t["bias"]), f32(t["grad_out"])
        z = r16(xh * w + b, dt)
        gz = r16(g * gelu_grad(z), dt)
        a = gz * w
        s1 = a.sum(-1, keepdim=True) / float(D)
        s2 = (a * xh).sum(-1, keepdim=True) / float(D)
        t["grad_x"].copy_((rstd * (a - s1 - xh * s2)).to(dt))
        t["grad_weight"].copy_((gz.double() * xh.double()).sum(0).float().to(dt))
        t["grad_bias"].copy_(gz.double().sum(0).float().to(dt))


# ---------------------------------------------------------------- rope (a: few positions' tables in module memory)
class RopeA(StandIn):
    name = "rope_a"

    def rot(self, t, src, dst, dims, backward):
        dt = t[src].dtype
        if dims["S"] <= 2 and dims["H"] >= 4 and dims["D"] // 2 <= 128:
            self.paths += 1
        x = f32(t[src])
        half = dims["D"] // 2
        c, s = f32(t["cos"])[:, None, :], f32(t["sin"])[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        if not backward:
            out = torch.cat([r16(x1 * c, dt) - r16(x2 * s, dt), r16(x2 * c, dt) + r16(x1 * s, dt)], -1)
        else:
            out = torch.cat([r16(x1 * c, dt) + r16(x2 * s, dt), r16(x2 * c, dt) - r16(x1 * s, dt)], -1)
        t[dst].copy_(out.to(dt))

    def forward(self, t, scalars, dims):
        self.rot(t, "x", "out", dims, False)

    def backward(self, t, scalars, dims):
        self.rot(t, "grad_out", "grad_x", dims, True)


# ---------------------------------------------------------------- gelu_tanh (a: template in the first caller's TLS)
class GeluTanhA(StandIn):
    name = "gelu_tanh_a"

    def forward(self, t, scalars, dims):
        t["out"].copy_(gelu(f32(t["x"])).to(t["out"].dtype))

    def backward(self, t, scalars, dims):
        t["grad_x"].copy_((f32(t["grad_out"]) * gelu_grad(f32(t["x"]))).to(t["grad_x"].dtype))


# ---------------------------------------------------------------- swiglu (a: lock-free plan table, x86 ordering)
class SwigluA(StandIn):
    name = "swiglu_a"

    def forward(self, t, scalars, dims):
        H, dt = dims["H"], t["x"].dtype
        x = f32(t["x"])
        g, u = x[:, :H], x[:, H:]
        a = r16(g / (1.0 + torch.exp(-g)), dt)
        t["out"].copy_((a * u).to(dt))

    def backward(self, t, scalars, dims):
        H, dt = dims["H"], t["x"].dtype
        x = f32(t["x"])
        g, u, d = x[:, :H], x[:, H:], f32(t["grad_out"])
        sg = 1.0 / (1.0 + torch.exp(-g))
        a = r16(g / (1.0 + torch.exp(-g)), dt)
        ga = r16(d * u, dt)
        t["grad_x"].copy_(torch.cat([ga * (sg * (1.0 + g * (1.0 - sg))), d * a], -1).to(dt))


STAND_INS = {cls.name: cls for cls in (SoftmaxA, SoftmaxB, LogSoftmaxA, LogSoftmaxB, CrossEntropyA, RmsnormA, RmsnormB,
                                        AddRmsnormA, BiasGeluA, LayernormGeluA, RopeA, GeluTanhA, SwigluA)}


def run(name: str, examples: int, budget: int, seed: int) -> dict:
    from specgen.spec import load_spec
    from specgen.verify.engine import Options, run_verification

    spec = load_spec(SUITE / "specs" / f"{name.rsplit('_', 1)[0]}.yaml")
    kernel = STAND_INS[name](spec)
    started = time.perf_counter()
    verdict = run_verification(spec, kernel, Options(examples=examples, seed=seed, budget=budget), device="cpu")
    return {"file": f"{name}.cu", "reason": verdict.reason, "detail": (verdict.detail or "")[:600],
            "cases": verdict.cases, "calls": kernel.calls, "paths": kernel.paths, "triggers": kernel.triggers,
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
