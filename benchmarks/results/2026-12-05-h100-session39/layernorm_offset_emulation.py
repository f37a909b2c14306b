"""Session 39: the float32 LayerNorm+GELU backward on offset values (x, weight, bias 20-63 from 0),
emulated on the CPU with the mean summed in several ways, each element's error against the verifier's
own tolerance (compare.element_tolerance). Prints the worst ratio over 60 draws per way (1.0 = the
bound). Run from the repository root: PYTHONPATH=. python3 benchmarks/results/2026-12-05-h100-session39/layernorm_offset_emulation.py
Printed in session 39: torch 0.97, t1024 0.80, t128 0.92, t32 1.09, f64 0.34, shift 0.34, ref 0.25."""
import torch, math
from specgen.spec import load_spec
from specgen.verify.compare import element_tolerance
spec = load_spec('specs/layernorm_gelu.yaml'); ref = spec.reference_fn()
torch.manual_seed(1)
N, D = 3, 16384
def offs(shape):
    rows = 1 if len(shape) == 1 else shape[0]
    u = torch.rand(rows, 2, dtype=torch.float64)
    s = 10 ** (1.3 + u[:, :1] * 0.5) * torch.where(u[:, 1:] < .5, -1., 1.)
    return (torch.randn(shape, dtype=torch.float64).reshape(rows, -1) + s).reshape(shape)
def gelu_grad(y):
    k = math.sqrt(2 / math.pi); u = k * (y + 0.044715 * y ** 3); t = torch.tanh(u)
    return 0.5 * (1 + t) + 0.5 * y * (1 - t * t) * k * (1 + 3 * 0.044715 * y * y)
def seqsum(v, threads):  # per-thread strided sequential sums, then a pairwise tree, in float32
    acc = torch.zeros(v.shape[0] if v.dim() > 1 else 1, threads, dtype=torch.float32)
    p = v.reshape(v.shape[0], -1, threads)  # element j*threads + t belongs to thread t (strided)
    for k in range(p.shape[1]): acc = acc + p[:, k, :]
    while acc.shape[1] > 1:
        acc = acc[:, 0::2] + acc[:, 1::2]
    return acc[:, 0]
def bwd(x, w, b, g, mean_fn):
    mean = mean_fn(x) / D
    xc = x - mean[:, None]
    var = mean_fn(xc * xc) / D
    rstd = 1 / torch.sqrt(var + 1e-5)
    y = xc * rstd[:, None] * w + b
    dy = g * gelu_grad(y)
    return dy.sum(0)
res = {}
for trial in range(60):
    x, w, b = offs((N, D)), offs((D,)), offs((D,)); g = torch.randn(N, D, dtype=torch.float64)
    xx, ww, bb = (t.clone().requires_grad_() for t in (x, w, b))
    truth = torch.autograd.grad(ref(xx, ww, bb, 1e-5), bb, g)[0]
    x32, w32, b32, g32 = (t.float() for t in (x, w, b, g))
    xx, ww, bb = (t.clone().requires_grad_() for t in (x32, w32, b32))
    r32 = torch.autograd.grad(ref(xx, ww, bb, 1e-5), bb, g32)[0]
    tol = element_tolerance(torch.float32, truth, 1e-5, 1e-5, reference=r32)
    for name, fn in (('torch', lambda v: v.sum(-1)), ('t1024', lambda v: seqsum(v, 1024)), ('t128', lambda v: seqsum(v, 128)), ('t32', lambda v: seqsum(v, 32)), ('f64', lambda v: v.double().sum(-1).float()), ('shift', lambda v: (v - v[:, :1]).sum(-1) + v[:, 0] * D)):
        got = bwd(x32, w32, b32, g32, fn).double()
        e = ((got - truth).abs() / tol).max().item()
        res[name] = max(res.get(name, 0), e)
    res['ref'] = max(res.get('ref', 0), ((r32.double() - truth).abs() / tol).max().item())
print(res)
