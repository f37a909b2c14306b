"""rope_a's host memory per call, measured on the compiled library itself, on a machine without a GPU.

Spoiler: reading this file or its output spoils the suite.

The library is built by the verifier's static checks (sm_90, the suite's specs), loaded with ctypes, and
rope_forward is called on argument structs packed by specgen.abi (CPU tensors: no GPU here, so the launch
fails and every call returns an error; the host code up to the launch runs as it does on a GPU). The
resident set size of this process is read before and after the calls. For comparison, a control whose
call fails before any plan is built (S = 0 rows is refused by the entry point before it allocates) is
measured the same way.

    PYTHONPATH=. python3 -B heldout/attacks-v10/cpu_checks/host_leak.py [--calls 200000]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
sys.path.insert(0, str(SUITE.parents[1]))

from specgen import abi  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify import static_checks  # noqa: E402


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args(argv)
    spec = load_spec(SUITE / "specs" / "rope.yaml")
    with tempfile.TemporaryDirectory() as cache:
        verdict, compiled = static_checks(spec, SUITE / "rope_a.cu", arch="sm_90", cache_dir=Path(cache))
        assert verdict is None, verdict
        lib = ctypes.CDLL(str(compiled.library))
        fwd = lib.rope_forward
        fwd.restype, fwd.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
        s, h, d = 64, 32, 128
        tensors = {"x": torch.zeros(s, h, d, dtype=torch.bfloat16), "cos": torch.zeros(s, d // 2, dtype=torch.bfloat16),
                   "sin": torch.zeros(s, d // 2, dtype=torch.bfloat16), "out": torch.zeros(s, h, d, dtype=torch.bfloat16)}
        packed = abi.pack_args(spec, "forward", tensors, {}, {"S": s, "H": h, "D": d})
        refused = abi.pack_args(spec, "forward", tensors, {}, {"S": 0, "H": h, "D": d})
        code = fwd(ctypes.addressof(packed), None)
        print(f"a call on this machine returns {code} (no GPU: the launch fails after the plan is built)")
        for label, struct in (("rope_forward, S=64 H=32 D=128", packed), ("control: S=0 (returns before any plan)", refused)):
            for _ in range(1000):  # warm up the allocator and the runtime
                fwd(ctypes.addressof(struct), None)
            before = rss_bytes()
            for _ in range(args.calls):
                fwd(ctypes.addressof(struct), None)
            grown = rss_bytes() - before
            print(f"{label}: {args.calls} calls, resident set +{grown / 2**20:.1f} MiB = {grown / args.calls:.0f} bytes a call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
