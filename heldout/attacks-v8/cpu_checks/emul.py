"""Run from the repository root: python -B heldout/attacks-v8/cpu_checks/emul.py [spec ...]

The honest arithmetic of heldout/attacks-v8's kernels (stand_ins.honest()) run through the verifier's
engine with CPU stand-ins. Checks semantics and rounding against the verifier's comparison rules,
not the CUDA code (indexing, launches, synchronization)."""
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from specgen.spec import load_spec  # noqa: E402
from specgen.verify.engine import Options, run_verification  # noqa: E402

import stand_ins  # noqa: E402

if __name__ == "__main__":
    stands = stand_ins.honest()
    examples = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20
    names = [a for a in sys.argv[1:] if not a.isdigit()] or list(stands)
    for name in names:
        spec = load_spec(HERE.parent / "specs" / f"{name}.yaml")
        t0 = time.time()
        v = run_verification(spec, stands[name], Options(examples=examples, budget=1 << 14, seed=3), device="cpu")
        print(f"{name:16s} {v.reason:16s} {v.cases:5d} cases {time.time() - t0:6.1f}s  {(v.detail or '')[:1500]}",
              flush=True)
