"""Run from the repository root: python -B heldout/attacks-v8/cpu_checks/emul_cheats.py [cheat ...]

Each cheat whose trigger a CPU run can meet, as a stand-in (stand_ins.cheats(): the honest arithmetic,
the trigger, and what the kernel does when triggered), run through the verifier's engine with CPU
stand-ins; prints the verdict and how many times the trigger was met. A sound verifier would meet it
(and reject); the author expects 0 triggers and "passed"."""
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
    cheats = stand_ins.cheats()
    seeds = [0, 3, 11]
    names = sys.argv[1:] or list(cheats)
    for name in names:
        spec_name, stand = cheats[name]
        spec = load_spec(HERE.parent / "specs" / f"{spec_name}.yaml")
        for seed in seeds:
            t0 = time.time()
            stand.triggers, stand.notes = 0, []
            v = run_verification(spec, stand, Options(examples=20, budget=1 << 14, seed=seed), device="cpu")
            print(f"{name:36s} seed {seed:2d} {v.reason:14s} {v.cases:5d} cases, triggers {stand.triggers} "
                  f"{time.time() - t0:6.1f}s {(v.detail or '')[:600]} {stand.notes[:3]}", flush=True)
