"""CPU stand-ins of the suite's kernels (attacks-v10): each kernel's arithmetic as the .cu computes it,
in torch float32 (double where the kernel sums in double), with the kernel's rounding points for
16-bit dtypes, its reduction order (per-thread strided sums, a warp butterfly, warps in order) and its
NaN/inf semantics; the cheats' trigger conditions are counted (and, where `armed`, acted on).

Spoiler: reading this file spoils the suite as much as reading the kernels.

They implement the interface the verifier's CPU runner calls (tests/verify_fakes.py's PyKernel:
has, call, error_name, clear_error, workspace_bytes), so `specgen.verify.engine.run_verification(...,
device="cpu")` runs the verifier's own checks on them. This checks semantics and rounding against the
verifier's comparison rules; it does not run the CUDA code (indexing, launches, synchronization).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

F32 = torch.float32
K_BETA = torch.tensor(0.7978845608028654, dtype=F32)
K_KAPPA = torch.tensor(0.044715, dtype=F32)


# ------------------------------------------------------------------ helpers

def rnd(v: torch.Tensor, dtype) -> torch.Tensor:
    """float32 -> the dtype (round to nearest even) -> float32."""
    return v if dtype == F32 else v.to(dtype).to(F32)


def trunc_bf16(v: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 by keeping the upper 16 bits (rounding toward zero) -> float32."""
    bits = v.contiguous().view(torch.int32) & torch.tensor(-65536, dtype=torch.int32)
    return bits.view(F32)


def block_sum(v: torch.Tensor, block: int) -> torch.Tensor:
    """Sum over the last dim as a block of `block` threads does it: thread t adds elements t, t+block,
    ... in order (float32), a butterfly in each warp, then the warps in order."""
    d = v.shape[-1]
    pad = (-d) % block
    vp = F.pad(v, (0, pad)) if pad else v
    vp = vp.reshape(*v.shape[:-1], -1, block)
    acc = torch.zeros(vp.shape[:-2] + (block,), dtype=F32)
    for j in range(vp.shape[-2]):
        acc = acc + vp[..., j, :]
    acc = acc.reshape(*acc.shape[:-1], block // 32, 32)
    lanes = torch.arange(32)
    for o in (16, 8, 4, 2, 1):
        acc = acc + acc[..., lanes ^ o]
    warps = acc[..., 0]
    r = torch.zeros(warps.shape[:-1], dtype=F32)
    for k in range(warps.shape[-1]):
        r = r + warps[..., k]
    return r


def warp_sum(v: torch.Tensor) -> torch.Tensor:
    return block_sum(v, 32)


def nan_max(v: torch.Tensor) -> torch.Tensor:
    """torch's amax: NaN wins; -inf for an empty row."""
    return v.amax(dim=-1)


def reg_block(d: int) -> int:
    """The block the softmax-family row kernels use for a row of width d."""
    return 128 if d <= 1024 else 256 if d <= 4096 else 512 if d <= 16384 else 1024


def gelu_f(x: torch.Tensor) -> torch.Tensor:
    x_cube = x * x * x
    inner = K_BETA * (x + K_KAPPA * x_cube)
    return 0.5 * x * (1.0 + torch.tanh(inner))


def gelu_grad_f(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    x_sq = x * x
    x_cube = x_sq * x
    inner = K_BETA * (x + K_KAPPA * x_cube)
    tanh_inner = torch.tanh(inner)
    left = 0.5 * x
    right = 1.0 + tanh_inner
    left_derivative = 0.5 * right
    tanh_derivative = 1.0 - tanh_inner * tanh_inner
    inner_derivative = K_BETA * (1.0 + 3.0 * K_KAPPA * x_sq)
    right_derivative = left * tanh_derivative * inner_derivative
    return dy * (left_derivative + right_derivative)


def column_chunks(values: torch.Tensor, rows_per_chunk: int) -> torch.Tensor:
    """Column sums in two fixed-order levels: each chunk of rows summed in double in row order (the
    values themselves float32), then the chunks in double."""
    n = values.shape[0]
    parts = []
    for r0 in range(0, n, rows_per_chunk):
        acc = torch.zeros(values.shape[1], dtype=torch.float64)
        for r in range(r0, min(n, r0 + rows_per_chunk)):
            acc = acc + values[r].double()
        parts.append(acc)
    total = torch.zeros(values.shape[1], dtype=torch.float64)
    for p in parts:
        total = total + p
    return total.to(F32)


def aligned16(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


class StandIn:
    """The verifier's stand-in interface; `fwd`/`bwd` write the outputs in place."""

    capturable = True

    def __init__(self, spec, name: str, armed: bool = False):
        self.spec, self.name, self.armed = spec, name, armed
        self.calls = 0
        self.triggers = 0
        self.allocations_fail = False
        self.log: list = []

    def has(self, direction: str) -> bool:
        return True

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.calls += 1
        t = {k: v for k, v in tensors.items()}
        with torch.no_grad():
            fn = self.fwd if direction == "forward" else self.bwd
            return int(fn(t, scalars, dims, stream) or 0)

    def workspace_bytes(self, direction, tensors, scalars, dims) -> int:
        return 0

    def error_name(self, code: int) -> str:
        return {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 900: "cudaErrorStreamCaptureUnsupported"}.get(
            code, f"cudaError {code}")

    def clear_error(self) -> None:
        pass


def dtype_of(t: torch.Tensor):
    return t.dtype


# ------------------------------------------------------------------ softmax (softmax_a, softmax_b)

def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    xf = x.float()
    m = nan_max(xf)
    e = torch.exp(xf - m[..., None])
    s = block_sum(e, reg_block(d))
    return e / s[..., None]


class Softmax(StandIn):
    """softmax_b (control) and softmax_a: the same rows; softmax_a's few-row split path counted
    (`self.few`) and emulated (chunk pairs, the fast merge where every element is finite)."""

    split = False  # softmax_a: True

    def workspace_bytes(self, direction, tensors, scalars, dims) -> int:
        if self.split and direction == "forward" and dims["N"] <= 16 and dims["D"] >= 2048:
            return 256 + 8 * dims["N"] * -(-dims["D"] // 2048)
        return 0

    def fwd(self, t, scalars, dims, stream):
        x, out = t["x"], t["out"]
        n, d = dims["N"], dims["D"]
        if self.split and n <= 16 and d >= 2048:
            self.triggers += 1
            self.log.append((n, d, str(x.dtype), getattr(stream, "kind", "?")))
            xf = x.float()
            if not torch.isfinite(xf).all():  # the flag read back: the careful kernel
                out.copy_(softmax_rows(x).to(out.dtype))
                return 0
            chunks = xf.split(2048, dim=-1)
            ms = [c.amax(-1) for c in chunks]
            ss = [block_sum(torch.exp(c - mm[..., None]), 256) for c, mm in zip(chunks, ms)]
            big = torch.stack(ms, -1).amax(-1)
            total = torch.zeros_like(big)
            for mm, sv in zip(ms, ss):
                total = total + sv * torch.exp(mm - big)
            out.copy_((torch.exp(xf - big[..., None]) / total[..., None]).to(out.dtype))
            return 0
        out.copy_(softmax_rows(x).to(out.dtype))
        return 0

    def bwd(self, t, scalars, dims, stream):
        y, g = t["out"].float(), t["grad_out"].float()
        dot = block_sum(g * y, reg_block(dims["D"]))
        t["grad_x"].copy_((y * (g - dot[..., None])).to(t["grad_x"].dtype))
        return 0


class SoftmaxSplit(Softmax):
    split = True


# ------------------------------------------------------------------ log_softmax (log_softmax_a, log_softmax_b)

class LogSoftmax(StandIn):
    """log_softmax_a/_b's rows. `four`: log_softmax_b's bfloat16 path for calls of 2^25 elements or
    more (counted; armed, it leaves the last N % 4 rows unwritten). `wrap`: log_softmax_a's 32-bit row
    offsets (counted where N x D passes 2^32; armed, applied)."""

    four = False
    wrap = False

    def fwd(self, t, scalars, dims, stream):
        x, out = t["x"], t["out"]
        n, d = dims["N"], dims["D"]
        if self.wrap and n * d > 2**32:
            self.triggers += 1
        if self.four and x.dtype == torch.bfloat16 and n * d >= 2**25:
            self.log.append((n, d))
            if n % 4:
                self.triggers += 1
            block = 256
        else:
            block = reg_block(d)
        xf = x.float()
        m = nan_max(xf)
        s = block_sum(torch.exp(xf - m[..., None]), block)
        res = ((xf - m[..., None]) - torch.log(s)[..., None]).to(out.dtype)
        if self.four and self.armed and x.dtype == torch.bfloat16 and n * d >= 2**25 and n % 4:
            res = res[: n // 4 * 4]
            out[: n // 4 * 4].copy_(res)
            return 0
        out.copy_(res)
        return 0

    def bwd(self, t, scalars, dims, stream):
        y, g = t["out"].float(), t["grad_out"].float()
        sg = block_sum(g, reg_block(dims["D"]))
        t["grad_x"].copy_((g - torch.exp(y) * sg[..., None]).to(t["grad_x"].dtype))
        return 0


class LogSoftmaxFour(LogSoftmax):
    four = True


class LogSoftmaxWrap(LogSoftmax):
    wrap = True


# ------------------------------------------------------------------ cross_entropy (a, b, c)

class CrossEntropy(StandIn):
    """cross_entropy_c (control); `zero_path`: cross_entropy_a (a loss gradient of exactly 0 counted;
    armed, float32 rows 16-byte aligned keep only their first half cleared); `narrow`: cross_entropy_b's
    warp-per-row forward for C <= 1024 (counted: the local-memory reservation happens at its first
    launch)."""

    zero_path = False
    narrow = False

    def workspace_bytes(self, direction, tensors, scalars, dims) -> int:
        return -(-4 * dims["N"] // 256) * 256 if direction == "forward" else 0

    def fwd(self, t, scalars, dims, stream):
        x, tgt = t["logits"].float(), t["target"]
        n, c = dims["N"], dims["C"]
        narrow = self.narrow and c <= 1024
        if narrow:
            self.triggers += 1
        m = nan_max(x)
        s = warp_sum(torch.exp(x - m[:, None])) if narrow else block_sum(torch.exp(x - m[:, None]), 256)
        logsum = torch.log(s)
        tc = tgt.clamp(0, c - 1)
        xt = x.gather(1, tc[:, None])[:, 0]
        loss = logsum - (xt - m)
        t["out"].copy_((loss.double().sum() / n).to(F32))
        t["saved_max"].copy_(m)
        t["saved_logsum"].copy_(logsum)
        return 0

    def bwd(self, t, scalars, dims, stream):
        x, tgt = t["logits"].float(), t["target"]
        n, c = dims["N"], dims["C"]
        g = t["grad_out"].float().reshape(())
        grad = t["grad_logits"]
        if self.zero_path and g.item() == 0.0:
            self.triggers += 1
            if self.armed:  # the kernel's clearing: 16-byte stores counted as 8 elements each
                if grad.dtype != F32:
                    grad.zero_()
                    return 0
                for r in range(n):
                    row = grad[r]
                    if aligned16(row):
                        nv = c // 8
                        row[: 4 * nv] = 0  # nv stores of 4 floats
                        row[8 * nv:] = 0   # the "tail"
                    else:
                        row.zero_()
                return 0
        scale = g / n
        m, logsum = t["saved_max"].float(), t["saved_logsum"].float()
        p = torch.exp((x - m[:, None]) - logsum[:, None])
        hot = torch.zeros_like(p)
        inside = (tgt >= 0) & (tgt < c)
        rows = torch.arange(n)[inside]
        hot[rows, tgt[inside]] = 1.0
        grad.copy_(((p - hot) * scale).to(grad.dtype))
        return 0


class CrossEntropyZero(CrossEntropy):
    zero_path = True


class CrossEntropyNarrow(CrossEntropy):
    narrow = True


# ------------------------------------------------------------------ rmsnorm (a, b) and add_rmsnorm (a)

def rms_wgrad_and_gx(xs: torch.Tensor, w: torch.Tensor, r: torch.Tensor, g: torch.Tensor, d: int):
    gw = g * w[None, :]
    xh = xs * r[:, None]
    dot = block_sum(gw * xh, 256)
    c = dot / d
    gx = r[:, None] * (gw - xh * c[:, None])
    wgrad = column_chunks(g * xh, 64)
    return gx, wgrad


class RMSNorm(StandIn):
    """rmsnorm_b (control) and rmsnorm_a; `band`: rmsnorm_a's forward for 12257 <= D <= 12288 counted
    (armed: the launch fails, cudaErrorInvalidValue)."""

    band = False

    def workspace_bytes(self, direction, tensors, scalars, dims) -> int:
        return 4 * -(-dims["N"] // 64) * dims["D"] if direction == "backward" else 0

    def fwd(self, t, scalars, dims, stream):
        d = dims["D"]
        eps = torch.tensor(float(scalars.get("eps", 1e-6)), dtype=F32)
        if self.band and 12257 <= d <= 12288:
            self.triggers += 1
            if self.armed:
                return 1
        x, w = t["x"].float(), t["weight"].float()
        block = 256 if self.band else reg_block(d)
        ss = block_sum(x * x, block)
        r = torch.rsqrt(ss / d + eps)
        t["out"].copy_(((x * r[:, None]) * w[None, :]).to(t["out"].dtype))
        t["saved_rstd"].copy_(r)
        return 0

    def bwd(self, t, scalars, dims, stream):
        x, w = t["x"].float(), t["weight"].float()
        g, r = t["grad_out"].float(), t["saved_rstd"].float()
        gx, wgrad = rms_wgrad_and_gx(x, w, r, g, dims["D"])
        t["grad_x"].copy_(gx.to(t["grad_x"].dtype))
        t["grad_weight"].copy_(wgrad.to(t["grad_weight"].dtype))
        return 0


class RMSNormBand(RMSNorm):
    band = True


class AddRMSNorm(StandIn):
    """add_rmsnorm_a: the bfloat16 vector path (every pointer 16-byte aligned, D a multiple of 8)
    rounds toward zero (counted as triggers: they are within the tolerance, so the engine passes)."""

    def workspace_bytes(self, direction, tensors, scalars, dims) -> int:
        return 4 * -(-dims["N"] // 64) * dims["D"] if direction == "backward" else 0

    def fwd(self, t, scalars, dims, stream):
        d = dims["D"]
        eps = torch.tensor(float(scalars.get("eps", 1e-6)), dtype=F32)
        x, res, w = t["x"], t["residual"], t["weight"]
        dtype = x.dtype
        vec = all(aligned16(t[k]) for k in ("x", "residual", "weight", "out", "residual_out")) and d % (16 // x.element_size()) == 0
        fast = vec and dtype == torch.bfloat16
        s32 = x.float() + res.float()
        if fast:
            self.triggers += 1
            s = trunc_bf16(s32)
        else:
            s = rnd(s32, dtype)
        ss = block_sum(s * s, reg_block(d))
        r = torch.rsqrt(ss / d + eps)
        y = (s * r[:, None]) * w.float()[None, :]
        if fast:
            t["out"].copy_(trunc_bf16(y).to(dtype))
        else:
            t["out"].copy_(y.to(dtype))
        t["residual_out"].copy_(s.to(dtype))
        t["saved_rstd"].copy_(r)
        return 0

    def bwd(self, t, scalars, dims, stream):
        dtype = t["x"].dtype
        s = rnd(t["x"].float() + t["residual"].float(), dtype)
        w, r = t["weight"].float(), t["saved_rstd"].float()
        g, gres = t["grad_out"].float(), t["grad_residual_out"].float()
        gn, wgrad = rms_wgrad_and_gx(s, w, r, g, dims["D"])
        gs = rnd(rnd(gn, dtype) + gres, dtype)
        t["grad_x"].copy_(gs.to(dtype))
        t["grad_residual"].copy_(gs.to(dtype))
        t["grad_weight"].copy_(wgrad.to(dtype))
        return 0


# ------------------------------------------------------------------ layernorm_gelu (a)

class LayerNormGelu(StandIn):
    """layernorm_gelu_a's arithmetic (its device-0 scratch pool cannot show on a CPU)."""

    def stats(self, x, d, eps):
        """mean in double, var of the deviations in double, rstd in float32 (as the kernel)."""
        xd = x.double()
        mean = xd.sum(-1) / d
        dev = xd - mean[:, None]
        q = (dev * dev).sum(-1)
        rstd = torch.rsqrt((q / d).to(F32) + eps)
        xh = (xd - mean[:, None]).to(F32) * rstd[:, None]
        return xh, rstd

    def fwd(self, t, scalars, dims, stream):
        d = dims["D"]
        eps = torch.tensor(float(scalars.get("eps", 1e-5)), dtype=F32)
        dtype = t["x"].dtype
        x, w, b = t["x"].float(), t["weight"].float(), t["bias"].float()
        xh, rstd = self.stats(x, d, eps)
        y = rnd(xh * w[None, :] + b[None, :], dtype)
        t["out"].copy_(gelu_f(y).to(dtype))
        return 0

    def bwd(self, t, scalars, dims, stream):
        d = dims["D"]
        eps = torch.tensor(float(scalars.get("eps", 1e-5)), dtype=F32)
        dtype = t["x"].dtype
        x, w, b, g = t["x"].float(), t["weight"].float(), t["bias"].float(), t["grad_out"].float()
        xh, rstd = self.stats(x, d, eps)
        y = rnd(xh * w[None, :] + b[None, :], dtype)
        gy = rnd(gelu_grad_f(g, y), dtype)
        tt = w[None, :] * gy
        mt = block_sum(tt, 256) / d
        mtx = block_sum(tt * xh, 256) / d
        gx = rstd[:, None] * ((tt - mt[:, None]) - xh * mtx[:, None])
        t["grad_x"].copy_(gx.to(dtype))
        t["grad_weight"].copy_(column_chunks(gy * xh, 64).to(dtype))
        t["grad_bias"].copy_(column_chunks(gy, 64).to(dtype))
        return 0


# ------------------------------------------------------------------ bias_gelu (a), gelu_tanh (a), swiglu (a), rope (a)

class BiasGelu(StandIn):
    """bias_gelu_a's arithmetic; its float32 staging copy's bytes per backward call are logged."""

    def fwd(self, t, scalars, dims, stream):
        dtype = t["x"].dtype
        s = rnd(t["x"].float() + t["bias"].float()[None, :], dtype)
        t["out"].copy_(gelu_f(s).to(dtype))
        return 0

    def bwd(self, t, scalars, dims, stream):
        n, d = dims["N"], dims["D"]
        if self.allocations_fail:
            return 2  # cudaErrorMemoryAllocation: checked, nothing launched
        self.log.append(4 * n * d)
        dtype = t["x"].dtype
        s = rnd(t["x"].float() + t["bias"].float()[None, :], dtype)
        gp = rnd(gelu_grad_f(t["grad_out"].float(), s), dtype)
        t["grad_x"].copy_(gp.to(dtype))
        t["grad_bias"].copy_(column_chunks(gp, 256).to(dtype))
        return 0


class GeluTanh(StandIn):
    """gelu_tanh_a: the dtype of the process's first forward call is recorded (the frozen flag)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.first_dtype = None

    def fwd(self, t, scalars, dims, stream):
        if self.first_dtype is None:
            self.first_dtype = t["x"].dtype
        dtype = t["x"].dtype
        t["out"].copy_(gelu_f(t["x"].float()).to(dtype))
        return 0

    def bwd(self, t, scalars, dims, stream):
        dtype = t["x"].dtype
        t["grad_x"].copy_(gelu_grad_f(t["grad_out"].float(), t["x"].float()).to(dtype))
        return 0


def silu_f(g: torch.Tensor) -> torch.Tensor:
    return g / (1.0 + torch.exp(-g))


class SwiGLU(StandIn):
    """swiglu_a's arithmetic (its launch attribute cannot show on a CPU)."""

    def fwd(self, t, scalars, dims, stream):
        h = dims["H"]
        dtype = t["x"].dtype
        x = t["x"].float()
        gate, up = x[:, :h], x[:, h:]
        t["out"].copy_((rnd(silu_f(gate), dtype) * up).to(dtype))
        return 0

    def bwd(self, t, scalars, dims, stream):
        h = dims["H"]
        dtype = t["x"].dtype
        x = t["x"].float()
        gate, up = x[:, :h], x[:, h:]
        dy = t["grad_out"].float()
        s = 1.0 / (1.0 + torch.exp(-gate))
        gu = dy * rnd(silu_f(gate), dtype)
        gs = rnd(dy * up, dtype)
        gg = (gs * s) * (1.0 + gate * (1.0 - s))
        t["grad_x"].copy_(torch.cat([gg, gu], dim=1).to(dtype))
        return 0


class Rope(StandIn):
    """rope_a's arithmetic; every call (forward or backward) counted: each leaks one plan on the GPU."""

    def rotate(self, a, b, c, s, dtype, backward):
        ac, bs = rnd(a * c, dtype), rnd(b * s, dtype)
        bc, as_ = rnd(b * c, dtype), rnd(a * s, dtype)
        if backward:
            return (ac + bs).to(dtype), (bc - as_).to(dtype)
        return (ac - bs).to(dtype), (bc + as_).to(dtype)

    def go(self, src, t, dims, out, backward):
        self.triggers += 1
        half = dims["D"] // 2
        dtype = src.dtype
        x = src.float()
        c = t["cos"].float()[:, None, :]
        s = t["sin"].float()[:, None, :]
        o1, o2 = self.rotate(x[..., :half], x[..., half:], c, s, dtype, backward)
        out.copy_(torch.cat([o1, o2], dim=-1))
        return 0

    def fwd(self, t, scalars, dims, stream):
        return self.go(t["x"], t, dims, t["out"], False)

    def bwd(self, t, scalars, dims, stream):
        return self.go(t["grad_out"], t, dims, t["grad_x"], True)


STAND_INS = {
    "softmax_b": Softmax, "softmax_a": SoftmaxSplit,
    "log_softmax_a": LogSoftmaxWrap, "log_softmax_b": LogSoftmaxFour,
    "cross_entropy_c": CrossEntropy, "cross_entropy_a": CrossEntropyZero, "cross_entropy_b": CrossEntropyNarrow,
    "rmsnorm_b": RMSNorm, "rmsnorm_a": RMSNormBand,
    "add_rmsnorm_a": AddRMSNorm, "layernorm_gelu_a": LayerNormGelu, "bias_gelu_a": BiasGelu,
    "gelu_tanh_a": GeluTanh, "swiglu_a": SwiGLU, "rope_a": Rope,
}
