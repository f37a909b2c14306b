"""CPU emulations (float32 torch ops) of the honest paths of attacks-v6's kernels, run through the
verifier's engine with CPU stand-ins: a check of the kernels' semantics (special values, the
roundings mirrored from torch, the closed-form backwards) against the verifier's own comparison
rules. Not a check of the CUDA code itself."""
import pathlib as _pl
_HERE = _pl.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]

import math, sys, time
import torch
sys.path.insert(0, str(_REPO))
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

F32 = torch.float32
INF = float('inf')

def rnd(v, dt):
    return v.to(dt).to(F32)

def ms_row(xf):
    """(m, s) per row with the kernels' semantics."""
    nan = torch.isnan(xf)
    m = torch.where(nan, torch.full_like(xf, -INF), xf).amax(-1)
    contrib = torch.where((xf == -INF) | nan, torch.zeros_like(xf), torch.exp(xf - m[..., None]))
    s = contrib.sum(-1)
    s = torch.where(nan.any(-1), torch.full_like(s, float('nan')), s)
    return m, s

def gelu_f(x):
    kBeta = float(math.sqrt(2) * (2 / math.sqrt(math.pi)) * 0.5)
    kBeta = torch.tensor(kBeta, dtype=F32)
    x_cube = x * x * x
    inner = kBeta * (x + 0.044715 * x_cube)
    return 0.5 * x * (1 + torch.tanh(inner))

def gelu_grad_f(dy, x):
    kBeta = torch.tensor(float(math.sqrt(2) * (2 / math.sqrt(math.pi)) * 0.5), dtype=F32)
    k = torch.tensor(0.044715, dtype=F32)
    x_sq = x * x
    x_cube = x_sq * x
    inner = kBeta * (x + k * x_cube)
    t = torch.tanh(inner)
    left = 0.5 * x
    right = 1 + t
    ld = 0.5 * right
    td = 1 - t * t
    idv = kBeta * (1 + 3 * k * x_sq)
    rd = left * td * idv
    return dy * (ld + rd)

def silu_f(x):
    return x / (1 + torch.exp(-x))

def silu_grad_f(dy, x):
    s = 1 / (1 + torch.exp(-x))
    return dy * s * (1 + x * (1 - s))


class Stand:
    def __init__(self, spec, fwd, bwd, ws=None):
        self.spec, self.fwd, self.bwd, self.ws = spec, fwd, bwd, ws
    def has(self, d): return True
    def error_name(self, c): return f"err {c}"
    def clear_error(self): pass
    def call(self, direction, t, scalars, dims, stream):
        (self.fwd if direction == 'forward' else self.bwd)(t, scalars, dims)
        return 0
    def workspace_bytes(self, direction, t, scalars, dims):
        return self.ws(direction, t, scalars, dims) if self.ws else 0

# ---- softmax
def softmax_fwd(t, sc, d):
    x = t['x']; xf = x.float()
    m, s = ms_row(xf)
    t['out'].copy_((torch.exp(xf - m[..., None]) / s[..., None]).to(x.dtype))
def softmax_bwd(t, sc, d):
    y = t['out'].float(); g = t['grad_out'].float()
    dot = (g * y).sum(-1, keepdim=True)
    t['grad_x'].copy_((y * (g - dot)).to(t['grad_x'].dtype))

# ---- log_softmax
def log_softmax_fwd(t, sc, d):
    x = t['x']; xf = x.float()
    m, s = ms_row(xf)
    t['out'].copy_(((xf - m[..., None]) - torch.log(s)[..., None]).to(x.dtype))
def log_softmax_bwd(t, sc, d):
    y = t['out'].float(); g = t['grad_out'].float()
    t['grad_x'].copy_((g - torch.exp(y) * g.sum(-1, keepdim=True)).to(t['grad_x'].dtype))

# ---- cross_entropy
def ce_fwd(t, sc, d):
    x = t['logits'].float(); tg = t['target'].long()
    m, s = ms_row(x)
    nan = torch.isnan(x).any(-1)
    lse = torch.where(nan, torch.full_like(m, float('nan')),
          torch.where(m == INF, torch.full_like(m, INF), torch.where(m == -INF, torch.full_like(m, -INF), torch.log(s) + m)))
    t['saved_lse'].copy_(lse)
    xt = x.gather(1, tg[:, None])[:, 0]
    loss = (m - xt) + torch.log(s)
    t['out'].copy_((loss.double().sum() / x.shape[0]).float())
def ce_bwd(t, sc, d):
    x = t['logits'].float(); tg = t['target'].long(); N = x.shape[0]
    m, s = ms_row(x)
    scale = t['grad_out'].float() / torch.tensor(float(N), dtype=F32)
    p = torch.exp((x - m[:, None]) - torch.log(s)[:, None])
    onehot = torch.zeros_like(p, dtype=torch.bool); onehot[torch.arange(N), tg] = True
    g = torch.where(onehot, scale * p - scale, scale * p)
    t['grad_logits'].copy_(g.to(t['grad_logits'].dtype))

# ---- rmsnorm
def rms_fwd(t, sc, d):
    x = t['x'].float(); w = t['weight'].float(); eps = torch.tensor(sc.get('eps', 1e-6), dtype=F32)
    r = torch.rsqrt((x * x).sum(-1) / x.shape[-1] + eps)
    t['saved_rstd'].copy_(r)
    t['out'].copy_(((x * r[:, None]) * w).to(t['out'].dtype))
def rms_bwd(t, sc, d):
    x = t['x'].float(); w = t['weight'].float(); r = t['saved_rstd'].float(); g = t['grad_out'].float(); D = x.shape[-1]
    c = (g * w * x).sum(-1) * r / D
    t['grad_x'].copy_((r[:, None] * (g * w - (x * r[:, None]) * c[:, None])).to(t['grad_x'].dtype))
    t['grad_weight'].copy_((g * (x * r[:, None])).double().sum(0).float().to(t['grad_weight'].dtype))

# ---- add_rmsnorm
def arms_fwd(t, sc, d):
    dt = t['x'].dtype
    s = rnd(t['x'].float() + t['residual'].float(), dt); w = t['weight'].float()
    eps = torch.tensor(sc.get('eps', 1e-6), dtype=F32)
    r = torch.rsqrt((s * s).sum(-1) / s.shape[-1] + eps)
    t['saved_rstd'].copy_(r)
    t['residual_out'].copy_(s.to(dt))
    t['out'].copy_(((s * r[:, None]) * w).to(dt))
def arms_bwd(t, sc, d):
    dt = t['x'].dtype
    s = rnd(t['x'].float() + t['residual'].float(), dt); w = t['weight'].float(); r = t['saved_rstd'].float()
    g = t['grad_out'].float(); gr = t['grad_residual_out'].float(); D = s.shape[-1]
    c = (g * w * s).sum(-1) * r / D
    dn = r[:, None] * (g * w - (s * r[:, None]) * c[:, None])
    ds = (gr + rnd(dn, dt)).to(dt)
    t['grad_x'].copy_(ds); t['grad_residual'].copy_(ds)
    t['grad_weight'].copy_((g * (s * r[:, None])).double().sum(0).float().to(dt))

# ---- layernorm_gelu
def ln_moments(x, eps):
    D = x.shape[-1]
    mean = x.sum(-1) / D
    var = ((x - mean[:, None]) ** 2).sum(-1) / D
    return mean, torch.rsqrt(var + eps)
def lng_fwd(t, sc, d):
    dt = t['x'].dtype
    x = t['x'].float(); w = t['weight'].float(); b = t['bias'].float(); eps = torch.tensor(sc.get('eps', 1e-5), dtype=F32)
    mean, rstd = ln_moments(x, eps)
    z = (x - mean[:, None]) * rstd[:, None] * w + b
    t['out'].copy_(gelu_f(rnd(z, dt)).to(dt))
def lng_bwd(t, sc, d):
    dt = t['x'].dtype
    x = t['x'].float(); w = t['weight'].float(); b = t['bias'].float(); g = t['grad_out'].float()
    eps = torch.tensor(sc.get('eps', 1e-5), dtype=F32); D = x.shape[-1]
    mean, rstd = ln_moments(x, eps)
    xhat = (x - mean[:, None]) * rstd[:, None]
    zr = rnd(xhat * w + b, dt)
    dz = rnd(gelu_grad_f(g, zr), dt)
    dy = dz * w
    mdy = dy.sum(-1) / D; mdyx = (dy * xhat).sum(-1) / D
    t['grad_x'].copy_((rstd[:, None] * (dy - mdy[:, None] - xhat * mdyx[:, None])).to(dt))
    t['grad_weight'].copy_((dz * xhat).double().sum(0).float().to(dt))
    t['grad_bias'].copy_(dz.double().sum(0).float().to(dt))

# ---- swiglu
def sw_fwd(t, sc, d):
    dt = t['x'].dtype; x = t['x'].float(); H = x.shape[-1] // 2
    gate, up = x[:, :H], x[:, H:]
    t['out'].copy_((rnd(silu_f(gate), dt) * up).to(dt))
def sw_bwd(t, sc, d):
    dt = t['x'].dtype; x = t['x'].float(); H = x.shape[-1] // 2
    gate, up = x[:, :H], x[:, H:]; g = t['grad_out'].float()
    dg = silu_grad_f(rnd(g * up, dt), gate)
    du = g * rnd(silu_f(gate), dt)
    t['grad_x'].copy_(torch.cat([dg, du], -1).to(dt))

# ---- gelu_tanh
def gelu_fwd(t, sc, d):
    t['out'].copy_(gelu_f(t['x'].float()).to(t['out'].dtype))
def gelu_bwd(t, sc, d):
    t['grad_x'].copy_(gelu_grad_f(t['grad_out'].float(), t['x'].float()).to(t['grad_x'].dtype))

STANDS = {
    'softmax': (softmax_fwd, softmax_bwd), 'log_softmax': (log_softmax_fwd, log_softmax_bwd),
    'cross_entropy': (ce_fwd, ce_bwd), 'rmsnorm': (rms_fwd, rms_bwd), 'add_rmsnorm': (arms_fwd, arms_bwd),
    'layernorm_gelu': (lng_fwd, lng_bwd), 'swiglu': (sw_fwd, sw_bwd), 'gelu_tanh': (gelu_fwd, gelu_bwd),
}

if __name__ == '__main__':
    names = sys.argv[1:] or list(STANDS)
    for name in names:
        spec = load_spec(str(_REPO / f'heldout/attacks-v6/specs/{name}.yaml'))
        f, b = STANDS[name]
        t0 = time.time()
        v = run_verification(spec, Stand(spec, f, b), Options(examples=10, budget=1 << 14, seed=3), device='cpu')
        print(f'{name:16s} {v.reason:20s} cases={v.cases} {time.time()-t0:.0f}s', flush=True)
        if v.reason != 'passed':
            print('   ', v.detail[:1500]); print('   ', v.counterexample.describe() if v.counterexample else '')
