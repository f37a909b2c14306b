"""add_rmsnorm_size_cadence on the CPU: the verifier's engine with a stand-in that keeps the
kernel's bookkeeping (the last size-function question, the streak of calls that each follow a
question about their own arguments) and takes the wrong 'package' path from a streak of 4."""
import pathlib as _pl
_HERE = _pl.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]

import sys, time
sys.path.insert(0, str(_HERE)); sys.path.insert(0, str(_REPO))
import torch
import emul
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

def key(direction, t, scalars, dims):
    return (direction, tuple(sorted((k, v.data_ptr(), tuple(v.shape), str(v.dtype)) for k, v in t.items() if k != 'workspace')),
            tuple(sorted(scalars.items())), tuple(sorted(dims.items())))

class Cadence(emul.Stand):
    def __init__(self, spec, wrong_from=4):
        super().__init__(spec, emul.arms_fwd, emul.arms_bwd)
        self.asked, self.streak, self.max_streak, self.wrong_from, self.package_calls = None, 0, 0, wrong_from, 0
        self.calls = 0
    def workspace_bytes(self, direction, t, scalars, dims):
        if direction == 'forward':
            self.asked = key(direction, t, scalars, dims)
            return t['x'].shape[0] * 4
        return 0
    def call(self, direction, t, scalars, dims, stream):
        if direction != 'forward':
            return super().call(direction, t, scalars, dims, stream)
        self.calls += 1
        paired = self.asked is not None and self.asked == key(direction, t, scalars, dims)
        self.asked = None
        self.streak = self.streak + 1 if paired else 0
        self.max_streak = max(self.max_streak, self.streak)
        if self.streak >= self.wrong_from:
            self.package_calls += 1
            t['out'].zero_()  # stands for the wrong package path
            return 0
        return super().call(direction, t, scalars, dims, stream)

spec = load_spec(str(_REPO / 'heldout/attacks-v6/specs/add_rmsnorm.yaml'))
k = Cadence(spec)
t0 = time.time()
v = run_verification(spec, k, Options(examples=30, budget=1 << 16, seed=5, directions=('forward',)), device='cpu')
print(f'verifier on the CPU: {v.reason}, {v.cases} cases, {k.calls} forward calls, longest streak {k.max_streak}, '
      f'package-path calls {k.package_calls} ({time.time()-t0:.0f}s)')
# the package's pattern: size function, then the call, with the same struct, every call
k2 = Cadence(spec)
x = torch.randn(8, 4096); r = torch.randn(8, 4096); w = torch.randn(4096)
t = {'x': x, 'residual': r, 'weight': w, 'out': torch.empty(8, 4096), 'residual_out': torch.empty(8, 4096),
     'saved_rstd': torch.empty(8)}
for i in range(6):
    k2.workspace_bytes('forward', t, {'eps': 1e-6}, {'N': 8, 'D': 4096})
    k2.call('forward', t, {'eps': 1e-6}, {'N': 8, 'D': 4096}, None)
print(f'the package pattern, 6 calls: streak {k2.streak}, package-path calls {k2.package_calls} (from the 4th call)')
