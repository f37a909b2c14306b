"""swiglu_int8_grid_lut: how often the kernel's sniff fires on the verifier's value classes, and
what the half-precision table costs on a fake-quantized row (CPU, float32 arithmetic)."""
import pathlib as _pl
_HERE = _pl.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]

import sys
sys.path.insert(0, str(_REPO))
import torch
from specgen.inputs import _values, DISTRIBUTIONS

def sniff(gate):  # gate: [rows, H] float32, the kernel's test row by row
    finite = torch.isfinite(gate).all(-1)
    a = gate.abs()
    least = torch.where(a > 0, a, torch.full_like(a, float('inf'))).amin(-1)
    ok = finite & (least > 0) & torch.isfinite(least)
    q = torch.round(gate / least[:, None])
    on = ((q.abs() <= 255) & (q * least[:, None] == gate)).all(-1)
    return ok & on

gen = torch.Generator().manual_seed(0)
rows = 2000
for dtype in ('float32', 'float16', 'bfloat16'):
    fired = {}
    for dist in DISTRIBUTIONS:
        count = 0
        for H in (1024, 1031, 4096, 16384):
            r = rows if H < 16384 else 200
            v = _values((r, H), dist, gen, dtype).to(getattr(torch, dtype)).float()
            count += int(sniff(v).sum())
        fired[dist] = count
    print(dtype, 'rows on which the sniff fires, per value class (of', 3 * rows + 200, '):', fired)

# a fake-quantized float32 row (per-tensor affine, uint8, as torch.ao's FakeQuantize makes it)
x = torch.randn(64, 4096, generator=gen) * 2
scale = float(x.abs().max() / 127)
fq = torch.fake_quantize_per_tensor_affine(x, scale, 128, 0, 255)
print('fake-quantized rows: sniff fires on', int(sniff(fq).sum()), 'of', fq.shape[0])
silu = lambda v: v / (1 + torch.exp(-v))
table = silu(fq.double()).to(torch.float16).double()
up = torch.randn(64, 4096, generator=gen, dtype=torch.float64)
truth = silu(fq.double()) * up
got = (table * up).float().double()
err = (got - truth).abs()
tol = 1e-5 + (1e-5 + torch.finfo(torch.float32).eps) * truth.abs()
print(f'table path, float32: largest relative error {float((err / truth.abs().clamp_min(1e-30))[truth.abs() > 1e-3].max()):.2e}, '
      f'elements over the float32 tolerance: {int((err > tol).sum())} of {err.numel()}')
