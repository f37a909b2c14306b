"""Run from the repository root: python -B heldout/attacks-v7/cpu_checks/emul.py [spec ...]

CPU stand-ins of the honest arithmetic of heldout/attacks-v7 (float32 emulation, double sums where
the kernels use them), run through the verifier's engine on the CPU. Checks semantics and rounding
against the verifier's comparison rules, not the CUDA code."""
import math, sys, time
from pathlib import Path
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
import torch
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

F = torch.float32

def nan_amax(x):  # torch amax propagates NaN
    return x.amax(-1)

class Stand:
    def __init__(self, fwd, bwd, ws=None):
        self.fwd, self.bwd, self.ws = fwd, bwd, ws
    def has(self, d): return True
    def call(self, direction, t, scalars, dims, stream):
        (self.fwd if direction == "forward" else self.bwd)(t, scalars, dims)
        return 0
    def error_name(self, code): return f"cudaError {code}"
    def clear_error(self): pass

# ---------------- cross_entropy
def ce_fwd(t, s, d):
    x = t["logits"].float(); tg = t["target"]
    m = nan_amax(x)
    e = torch.exp(x - m[:, None])
    ssum = e.double().sum(-1)
    t["saved_max"].copy_(m)
    t["saved_logsum"].copy_(torch.log(ssum).float())
    xt = x.gather(1, tg[:, None])[:, 0]
    rows = (m.double() - xt.double()) + torch.log(ssum)
    t["out"].copy_((rows.sum() / x.shape[0]).float())
def ce_bwd(t, s, d):
    x = t["logits"].float(); tg = t["target"]; N = x.shape[0]
    g = t["grad_out"].float() / torch.tensor(float(N), dtype=F)
    m = t["saved_max"][:, None]; ls = t["saved_logsum"][:, None]
    p = torch.exp((x - m) - ls)
    v = g * p
    onehot = torch.zeros_like(v, dtype=torch.bool); onehot.scatter_(1, tg[:, None], True)
    v = torch.where(onehot, v - g, v)
    t["grad_logits"].copy_(v.to(t["grad_logits"].dtype))

# ---------------- softmax
def sm_fwd(t, s, d):
    x = t["x"].float(); m = nan_amax(x)[:, None]
    e = torch.exp(x - m); ssum = e.double().sum(-1, keepdim=True).float()
    t["out"].copy_((torch.exp(x - m) / ssum).to(t["out"].dtype))
def sm_bwd(t, s, d):
    y = t["out"].float(); g = t["grad_out"].float()
    dot = (g.double() * y.double()).sum(-1, keepdim=True).float()
    t["grad_x"].copy_((y * (g - dot)).to(t["grad_x"].dtype))

# ---------------- log_softmax (small path; the persistent one has the same result)
def lsm_fwd(t, s, d):
    x = t["x"].float(); m = nan_amax(x)[:, None]
    ssum = torch.exp(x.double() - m.double()).sum(-1, keepdim=True)
    lse = m.double() + torch.log(ssum)
    t["out"].copy_((x.double() - lse).float().to(t["out"].dtype))
def lsm_bwd(t, s, d):
    y = t["out"].float(); g = t["grad_out"].float()
    total = g.double().sum(-1, keepdim=True).float()
    t["grad_x"].copy_((g - torch.exp(y) * total).to(t["grad_x"].dtype))

# ---------------- rope
def rope_fwd(t, s, d):
    x = t["x"].float(); half = x.shape[-1] // 2
    c = t["cos"].float()[:, None, :]; sn = t["sin"].float()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], -1)
    t["out"].copy_(out.to(t["out"].dtype))
def rope_bwd(t, s, d):
    g = t["grad_out"].float(); half = g.shape[-1] // 2
    c = t["cos"].float()[:, None, :]; sn = t["sin"].float()[:, None, :]
    g1, g2 = g[..., :half], g[..., half:]
    t["grad_x"].copy_(torch.cat([g1 * c + g2 * sn, g2 * c - g1 * sn], -1).to(t["grad_x"].dtype))

# ---------------- gelu
KB = torch.tensor(0.7978845608028654, dtype=F); KK = torch.tensor(0.044715, dtype=F)
def gelu(x):
    inner = KB * (x + KK * (x * x * x))
    return 0.5 * x * (1.0 + torch.tanh(inner))
def gelu_grad(dy, x):
    x_sq = x * x; x_cube = x_sq * x
    inner = KB * (x + KK * x_cube); th = torch.tanh(inner)
    left = 0.5 * x; right = 1.0 + th
    return dy * (0.5 * right + left * (1.0 - th * th) * (KB * (1.0 + 3.0 * KK * x_sq)))
def gelu_fwd(t, s, d): t["out"].copy_(gelu(t["x"].float()).to(t["out"].dtype))
def gelu_bwd(t, s, d): t["grad_x"].copy_(gelu_grad(t["grad_out"].float(), t["x"].float()).to(t["grad_x"].dtype))

# ---------------- swiglu
def silu(g): return g / (1.0 + torch.exp(-g))
def sw_fwd(t, s, d):
    x = t["x"].float(); H = x.shape[-1] // 2
    t["out"].copy_((silu(x[:, :H]) * x[:, H:]).to(t["out"].dtype))
def sw_bwd(t, s, d):
    x = t["x"].float(); H = x.shape[-1] // 2; g, u = x[:, :H], x[:, H:]; dy = t["grad_out"].float()
    sg = 1.0 / (1.0 + torch.exp(-g))
    t["grad_x"].copy_(torch.cat([(dy * u) * sg * (1.0 + g * (1.0 - sg)), dy * silu(g)], -1).to(t["grad_x"].dtype))

# ---------------- rmsnorm
def rms_fwd(t, s, d):
    eps = s.get("eps", 1e-6); x = t["x"].float(); w = t["weight"].float(); D = x.shape[-1]
    ss = (x.double() ** 2).sum(-1)
    r = (1.0 / torch.sqrt(ss / D + eps)).float()
    t["saved_rstd"].copy_(r)
    t["out"].copy_(((x * r[:, None]) * w).to(t["out"].dtype))
def rms_bwd(t, s, d):
    x = t["x"].float(); w = t["weight"].float(); g = t["grad_out"].float(); D = x.shape[-1]
    r = t["saved_rstd"]
    dot = (g.double() * w.double() * x.double()).sum(-1)
    c = (r.double() ** 3 * dot / D).float()[:, None]
    t["grad_x"].copy_((r[:, None] * w * g - c * x).to(t["grad_x"].dtype))
    gw = (g.double() * x.double() * r.double()[:, None]).sum(0).float()
    t["grad_weight"].copy_(gw.to(t["grad_weight"].dtype))

# ---------------- layernorm_gelu
def ln_stats(x, eps):
    xd = x.double(); mean = xd.mean(-1, keepdim=True)
    var = ((xd - mean) ** 2).mean(-1, keepdim=True)
    return mean, 1.0 / torch.sqrt(var + eps)
def ln_fwd(t, s, d):
    eps = s.get("eps", 1e-5); x = t["x"].float(); w = t["weight"].float(); b = t["bias"].float()
    mean, rstd = ln_stats(x, eps)
    xh = ((x.double() - mean) * rstd).float()
    t["out"].copy_(gelu(xh * w + b).to(t["out"].dtype))
def ln_bwd(t, s, d):
    eps = s.get("eps", 1e-5); x = t["x"].float(); w = t["weight"].float(); b = t["bias"].float()
    g = t["grad_out"].float(); D = x.shape[-1]
    mean, rstd = ln_stats(x, eps)
    xh = ((x.double() - mean) * rstd).float()
    dy = gelu_grad(g, xh * w + b)
    dyw = dy.double() * w.double()
    m1 = (dyw.sum(-1, keepdim=True) / D).float(); m2 = ((dyw * xh.double()).sum(-1, keepdim=True) / D).float()
    rf = rstd.float()
    t["grad_x"].copy_((rf * (dy * w - m1 - xh * m2)).to(t["grad_x"].dtype))
    t["grad_weight"].copy_((dy.double() * xh.double()).sum(0).float().to(t["grad_weight"].dtype))
    t["grad_bias"].copy_(dy.double().sum(0).float().to(t["grad_bias"].dtype))

STANDS = {
    "cross_entropy": Stand(ce_fwd, ce_bwd), "softmax": Stand(sm_fwd, sm_bwd), "log_softmax": Stand(lsm_fwd, lsm_bwd),
    "rope": Stand(rope_fwd, rope_bwd), "gelu_tanh": Stand(gelu_fwd, gelu_bwd), "swiglu": Stand(sw_fwd, sw_bwd),
    "rmsnorm": Stand(rms_fwd, rms_bwd), "layernorm_gelu": Stand(ln_fwd, ln_bwd),
}

if __name__ == "__main__":
    names = sys.argv[1:] or list(STANDS)
    for name in names:
        spec = load_spec(HERE.parent / "specs" / f"{name}.yaml")
        t0 = time.time()
        v = run_verification(spec, STANDS[name], Options(examples=30, budget=1 << 14, seed=3), device="cpu")
        print(f"{name:16s} {v.reason:16s} {time.time()-t0:6.1f}s  {(v.detail or '')[:900]}", flush=True)
