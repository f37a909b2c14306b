#!/usr/bin/env python3
"""Host code of gelu_tanh_a on the CPU (no GPU: every CUDA call fails, the host code runs).

The library is compiled with specgen's own flags and loaded with ctypes. Every call returns the CUDA
error of its launch (no device) when its plan is valid, and cudaErrorInvalidValue (1) when the plan it
copied has an elements-per-thread value outside {1, 2, 4, 8} (garbage). Three runs, each in a fresh
process (the library's template is process-wide):
  alive:  thread A calls (builds and publishes its plans) and waits; thread B then makes its first
          call while A is alive  -> B's call returns the launch error (a valid plan)
  exited: thread A calls and ends; B makes its first call     -> B copies A's freed TLS block
  reused: thread A calls and ends; a thread C allocates and fills 64 blocks of that size (1540 bytes: the library's PT_TLS size) (glibc hands a
          new thread the ended thread's arena, so A's freed block among them) and ends; B makes its
          first call                                           -> B copies whatever is there now
A return code of -8 is SIGFPE: the host's integer division by a garbage plan's block size.

    PYTHONPATH=. python3 heldout/attacks-v12/cpu_checks/host_checks.py
"""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
REPO = SUITE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def build() -> str:
    from specgen.spec import load_spec
    from specgen.verify import static_checks

    spec = load_spec(SUITE / "specs" / "gelu_tanh.yaml")
    cache = Path(tempfile.mkdtemp(prefix="attacks-v12-host-"))
    verdict, compiled = static_checks(spec, SUITE / "gelu_tanh_a.cu", arch="sm_90", cache_dir=cache)
    assert verdict is None, verdict
    return str(compiled.library)


def child(library: str, mode: str, n_rows: int, n_cols: int) -> None:
    from specgen import abi
    from specgen.spec import load_spec

    spec = load_spec(SUITE / "specs" / "gelu_tanh.yaml")
    lib = ctypes.CDLL(library)
    Args = abi.ctypes_struct(spec, "forward")
    lib.gelu_tanh_forward.restype = ctypes.c_int
    lib.gelu_tanh_forward.argtypes = [ctypes.POINTER(Args), ctypes.c_void_p]

    def call(rows: int, cols: int) -> int:
        a = Args()
        a.x.dtype = 0  # float32
        a.N, a.D = rows, cols
        return lib.gelu_tanh_forward(ctypes.byref(a), None)

    results = {}
    go_on = threading.Event()

    def first() -> None:
        results["A"] = call(n_rows, n_cols)
        if mode == "alive":
            go_on.wait()

    a = threading.Thread(target=first)
    a.start()
    if mode == "alive":
        while "A" not in results:
            pass
    else:
        a.join()
    if mode == "reused":
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        def busy() -> None:  # a later thread (it gets the ended thread's malloc arena) allocating as a busy process does
            for _ in range(64):
                p = libc.malloc(1540)
                ctypes.memset(p, 0x5A, 1540)
        c = threading.Thread(target=busy)
        c.start()
        c.join()
    b = threading.Thread(target=lambda: results.__setitem__("B", call(n_rows, n_cols)))
    b.start()
    b.join()
    go_on.set()
    a.join()
    print(json.dumps({"mode": mode, "shape": [n_rows, n_cols], **results}))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    library = build()
    for mode in ("alive", "exited", "reused"):
        for shape in ((1, 1), (64, 4096)):
            out = subprocess.run([sys.executable, __file__, "--child", library, mode, *map(str, shape)],
                                 capture_output=True, text=True, timeout=120)
            line = (out.stdout.strip().splitlines() or [f"(no output; rc {out.returncode}; {out.stderr[-300:]})"])[-1]
            print(f"rc={out.returncode} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
