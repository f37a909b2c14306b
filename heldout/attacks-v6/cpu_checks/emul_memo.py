"""rmsnorm_memo_blocking_stream on the CPU: the memo as it behaves on a blocking stream (the CPU
runner passes no stream at all, which the stand-in takes as the legacy stream): the engine would
reject it there. On the GPU every call the verifier makes is on a torch.cuda.Stream(), which
PyTorch creates with cudaStreamNonBlocking, so the memo never engages."""
import pathlib as _pl
_HERE = _pl.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]

import sys, time
sys.path.insert(0, str(_HERE)); sys.path.insert(0, str(_REPO))
import emul
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

class Memo(emul.Stand):
    def __init__(self, spec, engage):
        super().__init__(spec, emul.rms_fwd, emul.rms_bwd)
        self.seen, self.engage, self.skipped = [], engage, 0
    def call(self, direction, t, scalars, dims, stream):
        if direction == 'forward' and self.engage(stream):
            key = (t['x'].data_ptr(), t['weight'].data_ptr(), t['out'].data_ptr(), t['saved_rstd'].data_ptr(),
                   tuple(sorted(dims.items())), str(t['x'].dtype), scalars.get('eps'))
            if key in self.seen:  # the kernel's table of the last 64 calls on a default stream
                self.skipped += 1
                return 0
            self.seen = (self.seen + [key])[-64:]
        return super().call(direction, t, scalars, dims, stream)

spec = load_spec(str(_REPO / 'heldout/attacks-v6/specs/rmsnorm.yaml'))
for label, engage in (('memo on (a blocking stream)', lambda s: s is None or s == 0), ('memo off (non-blocking)', lambda s: False)):
    k = Memo(spec, engage)
    t0 = time.time()
    v = run_verification(spec, k, Options(examples=10, budget=1 << 14, seed=11, directions=('forward',)), device='cpu')
    print(f'{label}: {v.reason} after {v.cases} cases, {k.skipped} calls skipped ({time.time() - t0:.0f}s)')
