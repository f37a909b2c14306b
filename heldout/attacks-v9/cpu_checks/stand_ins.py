"""CPU stand-ins for the kernels of heldout/attacks-v9: each kernel's float32 arithmetic (its
formulas, its NaN/inf handling and its path choices), written with torch on the CPU, with the
interface the verifier calls on a loaded library (call, has, error_name, clear_error).

They check semantics and rounding against the verifier's comparison rules, not the CUDA code
(indexing, launches, synchronization, reduction order). `honest(name)` is the honest arithmetic a
file shares with its spec's control; `cheat(name)` adds the file's wrong path where it is
arithmetic (the zero rows, the one-pass variance, the eps constant, the zero-gradient chunks).
"""
from __future__ import annotations

import math

import torch

F32 = torch.float32
K_BETA, K_KAPPA = 0.7978845608028654, 0.044715


class Kernel:
    def __init__(self, fwd, bwd):
        self.fwd, self.bwd = fwd, bwd
        self.calls = 0

    def has(self, direction: str) -> bool:
        return True

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.calls += 1
        (self.fwd if direction == "forward" else self.bwd)(tensors, scalars, dims)
        return 0

    def error_name(self, code: int) -> str:
        return f"cudaError {code}"

    def clear_error(self) -> None:
        pass


def rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).to(F32)


def put(out: torch.Tensor, value: torch.Tensor) -> None:
    out.copy_(value.reshape(out.shape).to(out.dtype))


def fmax_rows(x: torch.Tensor) -> torch.Tensor:
    """fmaxf over a row (NaN ignored), -inf for a row of NaN/-inf."""
    return torch.where(torch.isnan(x), torch.full_like(x, -math.inf), x).amax(-1, keepdim=True)


def rnd(v: torch.Tensor, dtype) -> torch.Tensor:
    return v.to(dtype).to(F32)


def gelu(z):
    return 0.5 * z * (1 + torch.tanh(K_BETA * (z + K_KAPPA * (z * z * z))))


def gelu_grad(z):
    z2 = z * z
    t = torch.tanh(K_BETA * (z + K_KAPPA * (z2 * z)))
    return 0.5 * (1 + t) + (0.5 * z) * (1 - t * t) * (K_BETA * (1 + 3 * K_KAPPA * z2))


# ------------------------------------------------------------------ softmax family

def softmax_fwd(t, s, d):
    x = rows(t["x"])
    m = fmax_rows(x)
    e = torch.exp(x - m)
    put(t["out"], e / e.sum(-1, keepdim=True))


def softmax_bwd(t, s, d):
    y, g = rows(t["out"]), rows(t["grad_out"])
    put(t["grad_x"], y * (g - (g * y).sum(-1, keepdim=True)))


def log_softmax_fwd(t, s, d):
    x = rows(t["x"])
    m = fmax_rows(x)
    ls = torch.log(torch.exp(x - m).sum(-1, keepdim=True))
    put(t["out"], (x - m) - ls)


def log_softmax_bwd(t, s, d):
    out, g = rows(t["out"]), rows(t["grad_out"])
    put(t["grad_x"], g - torch.exp(out) * g.sum(-1, keepdim=True))


def log_softmax_bwd_chunks(t, s, d):
    """log_softmax_b: an all-zero 8-element chunk of the gradient is written 0 (NaN in a NaN row)."""
    out, g = rows(t["out"]), rows(t["grad_out"])
    full = g - torch.exp(out) * g.sum(-1, keepdim=True)
    n, D = g.shape
    pad = (-D) % 8
    gz = torch.cat([g, torch.zeros(n, pad)], 1).view(n, -1, 8)
    zero = (gz == 0).all(-1, keepdim=True).expand(-1, -1, 8).reshape(n, -1)[:, :D]
    none = torch.where(torch.isnan(out[:, :1]), out[:, :1], torch.zeros_like(out[:, :1])).expand_as(full)
    put(t["grad_x"], torch.where(zero, none, full))


# ------------------------------------------------------------------ cross-entropy

def ce_fwd(t, s, d):
    x = rows(t["logits"])
    tgt = t["target"].reshape(-1).long()
    m = x.amax(-1, keepdim=True)  # NaN-propagating, as the kernels' NanMax
    ls = torch.log(torch.exp(x - m).sum(-1, keepdim=True))
    xt = x.gather(1, tgt[:, None])
    loss = ((m - xt) + ls).reshape(-1)
    t["saved_max"].copy_(m.reshape(-1))
    t["saved_logsum"].copy_(ls.reshape(-1))
    t["out"].copy_(loss.sum() / loss.numel())


def ce_bwd(t, s, d):
    x = rows(t["logits"])
    tgt = t["target"].reshape(-1).long()
    m, ls = t["saved_max"].reshape(-1, 1).to(F32), t["saved_logsum"].reshape(-1, 1).to(F32)
    scale = t["grad_out"].reshape(()).to(F32) / x.shape[0]
    p = torch.exp((x - m) - ls)
    onehot = torch.zeros_like(p).scatter_(1, tgt[:, None], 1.0)
    put(t["grad_logits"], (p - onehot) * scale)


# ------------------------------------------------------------------ rmsnorm, add_rmsnorm

def _rms_wgrad(g, xh):
    return (g * xh).sum(0)


def rms_fwd(t, s, d, scaled_above=None, eps_const=None):
    x, w = rows(t["x"]), t["weight"].to(F32)
    eps = float(s.get("eps", 1e-6)) if eps_const is None else eps_const
    D = x.shape[1]
    if scaled_above is not None and D > scaled_above:  # rmsnorm_b's overflow-safe path
        ax = torch.where(torch.isnan(x), x, x.abs())
        amax = torch.where(torch.isnan(ax).any(-1, keepdim=True), torch.full_like(ax[:, :1], math.nan),
                           ax.amax(-1, keepdim=True))
        inv = 1.0 / amax
        u = x * inv
        r = inv / torch.sqrt((u * u).sum(-1, keepdim=True) / D + torch.tensor(eps, dtype=F32) * inv * inv)
        r = torch.where(amax == math.inf, torch.zeros_like(r), r)
    else:
        r = 1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) / D + torch.tensor(eps, dtype=F32))
    t["saved_rstd"].copy_(r.reshape(-1))
    put(t["out"], (x * r) * w)


def rms_bwd(t, s, d):
    x, w, g = rows(t["x"]), t["weight"].to(F32), rows(t["grad_out"])
    r = t["saved_rstd"].reshape(-1, 1).to(F32)
    gw, xh = g * w, x * r
    c = (gw * xh).sum(-1, keepdim=True) / x.shape[1]
    put(t["grad_x"], r * (gw - xh * c))
    put(t["grad_weight"], _rms_wgrad(g, xh))


def addrms_fwd(t, s, d, big_eps=None):
    dt = t["x"].dtype
    sx = rnd(rows(t["x"]) + rows(t["residual"]), dt)
    w = t["weight"].to(F32)
    D = sx.shape[1]
    eps = float(s.get("eps", 1e-6))
    if big_eps is not None and sx.numel() >= (1 << 22):
        eps = big_eps
    r = 1.0 / torch.sqrt((sx * sx).sum(-1, keepdim=True) / D + torch.tensor(eps, dtype=F32))
    put(t["residual_out"], sx)
    t["saved_rstd"].copy_(r.reshape(-1))
    put(t["out"], (sx * r) * w)


def addrms_bwd(t, s, d):
    sx, w, g = rows(t["residual_out"]), t["weight"].to(F32), rows(t["grad_out"])
    r = t["saved_rstd"].reshape(-1, 1).to(F32)
    gw, sh = g * w, sx * r
    c = (gw * sh).sum(-1, keepdim=True) / sx.shape[1]
    ds = r * (gw - sh * c) + rows(t["grad_residual_out"])
    put(t["grad_x"], ds)
    put(t["grad_residual"], ds)
    put(t["grad_weight"], (g * sh).sum(0))


# ------------------------------------------------------------------ layernorm_gelu

def ln_stats(x, eps, one_pass_above=None):
    D = x.shape[1]
    if one_pass_above is not None and D > one_pass_above:
        mean = x.sum(-1, keepdim=True) / D
        var = (x * x).sum(-1, keepdim=True) / D - mean * mean
        var = torch.where(var < 0, torch.zeros_like(var), var)
    else:
        mean = x.sum(-1, keepdim=True) / D
        var = ((x - mean) ** 2).sum(-1, keepdim=True) / D
    return mean, 1.0 / torch.sqrt(var + torch.tensor(eps, dtype=F32))


def ln_fwd(t, s, d, one_pass_above=None):
    x, w, b = rows(t["x"]), t["weight"].to(F32), t["bias"].to(F32)
    mean, r = ln_stats(x, float(s.get("eps", 1e-5)), one_pass_above)
    put(t["out"], gelu((x - mean) * r * w + b))


def ln_bwd(t, s, d, one_pass_above=None):
    x, w, b, g = rows(t["x"]), t["weight"].to(F32), t["bias"].to(F32), rows(t["grad_out"])
    mean, r = ln_stats(x, float(s.get("eps", 1e-5)), one_pass_above)
    xh = (x - mean) * r
    dz = g * gelu_grad(xh * w + b)
    gw = dz * w
    D = x.shape[1]
    s1 = gw.sum(-1, keepdim=True) / D
    s2 = (gw * xh).sum(-1, keepdim=True) / D
    put(t["grad_x"], r * (gw - s1 - xh * s2))
    put(t["grad_weight"], (dz * xh).sum(0))
    put(t["grad_bias"], dz.sum(0))


# ------------------------------------------------------------------ elementwise

def gelu_fwd(t, s, d):
    put(t["out"], gelu(rows(t["x"])))


def gelu_bwd(t, s, d):
    put(t["grad_x"], rows(t["grad_out"]) * gelu_grad(rows(t["x"])))


def bias_gelu_fwd(t, s, d):
    put(t["out"], gelu(rows(t["x"]) + t["bias"].to(F32)))


def bias_gelu_bwd(t, s, d):
    gz = rows(t["grad_out"]) * gelu_grad(rows(t["x"]) + t["bias"].to(F32))
    put(t["grad_x"], gz)
    put(t["grad_bias"], gz.sum(0))


def _rope(x, c, sn, sign):
    S, H, D = x.shape
    half = D // 2
    x = x.to(F32)
    a, b = x[..., :half], x[..., half:]
    c, sn = c.to(F32)[:, None, :], sn.to(F32)[:, None, :]
    return torch.cat([a * c + sign * (b * sn), b * c - sign * (a * sn)], -1)


def rope_fwd(t, s, d):
    put(t["out"], _rope(t["x"], t["cos"], t["sin"], -1.0))


def rope_bwd(t, s, d):
    put(t["grad_x"], _rope(t["grad_out"], t["cos"], t["sin"], 1.0))


# ------------------------------------------------------------------ the kernels

HONEST = {
    "softmax": (softmax_fwd, softmax_bwd),
    "log_softmax": (log_softmax_fwd, log_softmax_bwd),
    "cross_entropy": (ce_fwd, ce_bwd),
    "rmsnorm": (rms_fwd, rms_bwd),
    "add_rmsnorm": (addrms_fwd, addrms_bwd),
    "layernorm_gelu": (lambda t, s, d: ln_fwd(t, s, d), lambda t, s, d: ln_bwd(t, s, d)),
    "gelu_tanh": (gelu_fwd, gelu_bwd),
    "bias_gelu": (bias_gelu_fwd, bias_gelu_bwd),
    "rope": (rope_fwd, rope_bwd),
}

# the arithmetic of the cheats whose wrong path is arithmetic (the others' arithmetic is honest)
CHEATS = {
    "log_softmax_b": ("log_softmax", log_softmax_fwd, log_softmax_bwd_chunks),
    "rmsnorm_b": ("rmsnorm", lambda t, s, d: rms_fwd(t, s, d, scaled_above=256), rms_bwd),
    "add_rmsnorm_a": ("add_rmsnorm", lambda t, s, d: addrms_fwd(t, s, d, big_eps=1e-6), addrms_bwd),
    "layernorm_gelu_a": ("layernorm_gelu", lambda t, s, d: ln_fwd(t, s, d, one_pass_above=1024),
                         lambda t, s, d: ln_bwd(t, s, d, one_pass_above=1024)),
}


def honest(spec_name: str) -> Kernel:
    return Kernel(*HONEST[spec_name])


def cheat(file_stem: str) -> tuple[str, Kernel]:
    spec_name, fwd, bwd = CHEATS[file_stem]
    return spec_name, Kernel(fwd, bwd)
