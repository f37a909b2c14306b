"""log_softmax_pingpong_scratch on the CPU: a stand-in whose call is the kernel's two launches
through a two-slot buffer taken in turn (the CPU runner interleaves the launches of calls side
by side as two streams do: A1 B1 A2 B2); then three calls interleaved (A1 B1 C1 A2 B2 C2)."""
import pathlib as _pl
_HERE = _pl.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]

import sys, time
sys.path.insert(0, str(_HERE)); sys.path.insert(0, str(_REPO))
import torch
import emul
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

class PingPong(emul.Stand):
    def __init__(self, spec):
        super().__init__(spec, None, emul.log_softmax_bwd)
        self.slots = [None, None]
        self.calls = 0
    def steps(self, direction, t, scalars, dims):
        if direction != 'forward':
            return [lambda: self.bwd(t, scalars, dims) or 0]
        slot = self.calls % 2
        self.calls += 1
        def stats():
            m, s = emul.ms_row(t['x'].float())
            self.slots[slot] = (m.clone(), torch.log(s).clone())
            return 0
        def write():
            m, ls = self.slots[slot]
            t['out'].copy_(((t['x'].float() - m[:, None]) - ls[:, None]).to(t['out'].dtype))
            return 0
        return [stats, write]
    def call(self, direction, t, scalars, dims, stream):
        for step in self.steps(direction, t, scalars, dims):
            step()
        return 0

spec = load_spec(str(_REPO / 'heldout/attacks-v6/specs/log_softmax.yaml'))
k = PingPong(spec)
t0 = time.time()
v = run_verification(spec, k, Options(examples=10, budget=1 << 15, seed=9, directions=('forward',)), device='cpu')
print(f'verifier on the CPU (forward): {v.reason}, {v.cases} cases ({time.time() - t0:.0f}s)')

def make(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 512, generator=g)
    return {'x': x, 'out': torch.empty(16, 512)}
calls = [make(s) for s in (1, 2, 3)]
turns = [k.steps('forward', c, {}, {'N': 16, 'D': 512}) for c in calls]
for i in range(2):
    for steps in turns:
        steps[i]()
for name, c in zip('ABC', calls):
    err = float((c['out'] - torch.log_softmax(c['x'], -1)).abs().max())
    print(f'three calls interleaved: call {name} max error {err:.3g}')
