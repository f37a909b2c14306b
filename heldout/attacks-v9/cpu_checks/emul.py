"""Run from the repository root: python -B heldout/attacks-v9/cpu_checks/emul.py [name ...] [--budget N]

The verifier's engine on the CPU (run_verification with device="cpu", small budget) over the
stand-ins of cpu_checks/stand_ins.py: a spec name runs the honest arithmetic the spec's files
share (its control's), a file stem (rmsnorm_b, layernorm_gelu_a, ...) runs that cheat's
arithmetic, which the verifier should pass too (its trigger is a situation the verifier does not
create; see triggers.py). Checks semantics and rounding against the verifier's comparison rules,
not the CUDA code. Each name takes a few minutes on one core."""
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from specgen.spec import load_spec  # noqa: E402
from specgen.verify.engine import Options, run_verification  # noqa: E402

import stand_ins  # noqa: E402


def main(argv: list[str]) -> int:
    budget = 1 << 14
    if "--budget" in argv:
        i = argv.index("--budget")
        budget = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    torch.set_num_threads(1)
    names = argv or list(stand_ins.HONEST) + list(stand_ins.CHEATS)
    failed = 0
    for name in names:
        if name in stand_ins.CHEATS:
            spec_name, kernel = stand_ins.cheat(name)
        else:
            spec_name, kernel = name, stand_ins.honest(name)
        spec = load_spec(HERE.parent / "specs" / f"{spec_name}.yaml")
        t0 = time.time()
        v = run_verification(spec, kernel, Options(examples=10, budget=budget, seed=7), device="cpu")
        failed += v.reason != "passed"
        print(f"{name:18s} {v.reason:16s} {v.cases:5d} cases {time.time() - t0:6.1f}s  {(v.detail or '')[:1200]}",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
