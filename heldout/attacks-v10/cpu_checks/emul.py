"""Run each kernel's CPU stand-in (stand_ins.py) through the verifier's own engine on the CPU
(`run_verification(..., device="cpu")`): the honest arithmetic must pass every check; the cheats'
triggers are counted (0 expected: the engine never creates them).

Spoiler: reading this file spoils the suite.

    PYTHONPATH=. python3 -B heldout/attacks-v10/cpu_checks/emul.py [file-stem ...] [--examples 10] [--budget 14] [--seed 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(SUITE.parents[1]))

from specgen.spec import load_spec  # noqa: E402
from specgen.verify.engine import Options, run_verification  # noqa: E402

from stand_ins import STAND_INS  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--examples", type=int, default=10)
    ap.add_argument("--budget", type=int, default=14, help="log2 of the element budget")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--endurance", type=int, default=200)
    args = ap.parse_args(argv)
    names = args.files or sorted(STAND_INS)
    bad = 0
    for name in names:
        spec = load_spec(SUITE / "specs" / f"{name.rsplit('_', 1)[0]}.yaml")
        standin = STAND_INS[name](spec, name)
        started = time.time()
        verdict = run_verification(spec, standin, Options(examples=args.examples, budget=1 << args.budget,
                                                          seed=args.seed, endurance=args.endurance), device="cpu")
        extra = ""
        if hasattr(standin, "first_dtype"):
            extra = f", first forward call's dtype {standin.first_dtype}"
        print(f"{name:18s} {verdict.reason:14s} cases {verdict.cases:5d} calls {standin.calls:6d} "
              f"triggers {standin.triggers:5d}{extra} ({time.time() - started:.0f} s)", flush=True)
        if verdict.reason != "passed":
            bad += 1
            print("   ", verdict.summary()[:3000].replace("\n", "\n    "), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
