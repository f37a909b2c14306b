"""swiglu_bwd_nan_grad_finite_tiles on the CPU: the verifier's engine (backward) with a stand-in
that keeps the kernel's tiles and its fast path; then the AMP-overflow situation."""
import pathlib as _pl
_HERE = _pl.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]

import sys, time
sys.path.insert(0, str(_HERE)); sys.path.insert(0, str(_REPO))
import torch
import emul
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

TILE = 4096
fast_hits = {'tiles': 0, 'nan_dropped': 0}

def bwd_cheat(t, sc, d):
    emul.sw_bwd(t, sc, d)  # the exact path everywhere
    x = t['x'].float(); H = x.shape[-1] // 2; N = x.shape[0]
    gate, up = x[:, :H].reshape(-1), x[:, H:].reshape(-1)
    g = t['grad_out'].float().reshape(-1)
    gx = t['grad_x'].view(N, 2 * H)
    n = N * H
    for tile0 in range(0, n - TILE + 1, TILE):  # full tiles only
        sl = slice(tile0, tile0 + TILE)
        if torch.isfinite(gate[sl]).all() and torch.isfinite(up[sl]).all():
            fast_hits['tiles'] += 1
            drop = ~(g[sl].abs() > 0)  # NaN (and exact zeros) -> 0
            if drop.any():
                fast_hits['nan_dropped'] += int(torch.isnan(g[sl][drop]).sum())
                idx = torch.arange(tile0, tile0 + TILE)[drop]
                rows, cols = idx // H, idx % H
                gx[rows, cols] = 0
                gx[rows, H + cols] = 0

spec = load_spec(str(_REPO / 'heldout/attacks-v6/specs/swiglu.yaml'))
t0 = time.time()
v = run_verification(spec, emul.Stand(spec, emul.sw_fwd, bwd_cheat), Options(examples=30, budget=1 << 16, seed=7,
                     directions=('backward',)), device='cpu')
print(f'verifier on the CPU (backward): {v.reason}, {v.cases} cases; fast-path tiles {fast_hits["tiles"]}, '
      f'NaN gradients dropped {fast_hits["nan_dropped"]} ({time.time() - t0:.0f}s)')
# finite activations, a gradient with NaN in it (an overflowed AMP step)
N, H = 8, 2048
x = torch.randn(N, 2 * H).half()
g = torch.randn(N, H).half(); g[0, :64] = float('nan')
t = {'x': x, 'grad_out': g, 'out': torch.empty(N, H).half(), 'grad_x': torch.empty(N, 2 * H).half()}
fast_hits['nan_dropped'] = 0
bwd_cheat(t, {}, {'N': N, 'H': H})
print(f'finite x, 64 NaN gradients: grad_x NaN count {int(torch.isnan(t["grad_x"]).sum())} (torch: 128), '
      f'dropped {fast_hits["nan_dropped"]}')
