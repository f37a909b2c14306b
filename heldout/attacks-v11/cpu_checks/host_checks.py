#!/usr/bin/env python3
"""Host-side mechanisms of four attacks-v11 kernels, shown on a machine without a GPU.

The libraries are compiled with specgen's own flags (specgen.toolchain.compile_kernel) and their
entry points called through ctypes with argument structs packed as the verifier packs them
(specgen.abi). With no GPU every CUDA call fails and every launch returns an error, but the host
code before and around the launches runs as it would on a GPU:

- softmax_a: a forward on a row wider than 32768 elements reaches its cudaMallocAsync, which fails
  here as it would on a full GPU; the call returns the error; the next forward (any width) never
  returns (it waits in lock()). softmax_b, the control, returns every time.
- swiglu_a: the host heap per forward call, on distinct tensor addresses (a new launch-table entry
  each) and on the same addresses again.
- gelu_tanh_a: the host heap per short-lived calling thread (one forward each) and per call from one
  thread.
- layernorm_gelu_a: its plan code (the `struct Plan` ... launch test, copied from the .cu) compiled
  by the host compiler with -fsigned-char (x86-64's char) and -funsigned-char (aarch64's): the
  schedule and block size each chooses for rows of 768, 1024, 1280 and 4096.

    PYTHONPATH=. python3 heldout/attacks-v11/cpu_checks/host_checks.py
"""
from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
REPO = SUITE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def compiled(name: str, cache: Path):
    from specgen.abi import write_header
    from specgen.spec import load_spec
    from specgen.toolchain import compile_kernel

    spec = load_spec(SUITE / "specs" / f"{name.rsplit('_', 1)[0]}.yaml")
    headers = cache / f"hdr-{spec.name}"
    headers.mkdir(parents=True, exist_ok=True)
    write_header(spec, headers)
    kernel = compile_kernel(SUITE / f"{name}.cu", include_dirs=[headers], arch="sm_90", name=name,
                            cache_dir=cache)
    lib = ctypes.CDLL(str(kernel.library))
    return spec, lib


def packed(spec, direction: str, shapes: dict, dims: dict, dtype_code: int, base: int, scalars=None):
    """An argument struct with tensors at fake device addresses from `base` (never dereferenced here)."""
    from specgen import abi

    struct = abi.ctypes_struct(spec, direction)()
    address = base
    for field in abi.fields(spec, direction):
        if field.role == "workspace":
            continue
        if field.is_tensor:
            t = abi.SpecgenTensor()
            shape = shapes[field.name]
            t.data = address
            for axis, (size, stride) in enumerate(zip(shape, abi.canonical_strides(shape))):
                t.sizes[axis], t.strides[axis] = size, stride
            t.ndim, t.dtype = len(shape), dtype_code
            setattr(struct, field.name, t)
            address += 1 << 30
        elif field.role == "dim":
            setattr(struct, field.name, dims[field.name])
        else:
            setattr(struct, field.name, (scalars or {}).get(field.name, field.scalar.default))
    return struct


def call_with_timeout(fn, seconds: float):
    box = {}

    def run():
        box["code"] = fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return box.get("code", "did not return")


def softmax(cache: Path) -> None:
    print("softmax_a / softmax_b: a forward whose scratch cannot be allocated, then another forward")
    for name in ("softmax_a", "softmax_b"):
        spec, lib = compiled(name, cache)
        entry = lib.softmax_forward
        entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
        wide = packed(spec, "forward", {"x": (1, 65536), "out": (1, 65536)}, {"N": 1, "D": 65536}, 0, 1 << 40)
        narrow = packed(spec, "forward", {"x": (37, 37), "out": (37, 37)}, {"N": 37, "D": 37}, 0, 1 << 41)
        first = call_with_timeout(lambda: entry(ctypes.addressof(wide), None), 5)
        second = call_with_timeout(lambda: entry(ctypes.addressof(narrow), None), 5)
        print(f"  {name}: wide-row forward returned {first}; the next forward (37 x 37): {second}"
              + (" within 5 s" if second == "did not return" else ""))


def heap() -> int:
    from specgen.verify.host_memory import heap_in_use

    return heap_in_use()[0]


def swiglu(cache: Path, calls: int = 20000) -> None:
    spec, lib = compiled("swiglu_a", cache)
    entry = lib.swiglu_forward
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
    shapes = {"x": (64, 2 * 4096), "out": (64, 4096)}
    same = packed(spec, "forward", shapes, {"N": 64, "H": 4096}, 2, 1 << 40)
    entry(ctypes.addressof(same), None)
    before = heap()
    for _ in range(calls):
        entry(ctypes.addressof(same), None)
    repeat = (heap() - before) / calls
    structs = [packed(spec, "forward", shapes, {"N": 64, "H": 4096}, 2, (1 << 40) + (k << 12)) for k in range(calls)]
    before = heap()
    for s in structs:
        entry(ctypes.addressof(s), None)
    fresh = (heap() - before) / calls
    print(f"swiglu_a: host heap per forward on addresses seen before {repeat:.1f} bytes; on new addresses "
          f"{fresh:.1f} bytes ({calls} calls each)")


def gelu(cache: Path, threads: int = 200) -> None:
    spec, lib = compiled("gelu_tanh_a", cache)
    entry = lib.gelu_tanh_forward
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
    args = packed(spec, "forward", {"x": (64, 4096), "out": (64, 4096)}, {"N": 64, "D": 4096}, 2, 1 << 40)
    entry(ctypes.addressof(args), None)
    before = heap()
    for _ in range(threads):
        entry(ctypes.addressof(args), None)
    one_thread = (heap() - before) / threads
    before = heap()
    for _ in range(threads):
        worker = threading.Thread(target=lambda: entry(ctypes.addressof(args), None))
        worker.start()
        worker.join()
    per_thread = (heap() - before) / threads
    print(f"gelu_tanh_a: host heap per call from one thread {one_thread:.1f} bytes; per short-lived calling thread "
          f"{per_thread:.0f} bytes ({threads} threads)")


def layernorm(cache: Path) -> None:
    source = (SUITE / "layernorm_gelu_a.cu").read_text()
    plan = re.search(r"^struct Plan \{.*?\n\};\n\nPlan plan_for\(int64_t D\) \{.*?\n\}\n", source, re.S | re.M).group(0)
    test = re.search(r"  if \(p\.rows_log2 >= 0\) \{\n    const int rows = 1 << p\.rows_log2;", source)
    assert test, "the launch test changed"
    program = ("#include <cstdint>\n#include <cstdio>\nconstexpr int kThreads = 256;\n" + plan + r"""
int main() {
  const int64_t widths[] = {768, 1024, 1280, 4096};
  for (int64_t D : widths) {
    const Plan p = plan_for(D);
    if (p.rows_log2 >= 0) {
      const int rows = 1 << p.rows_log2;
      std::printf("    D=%lld: rows_log2=%d, warp per row, %d rows a block, block of %d threads\n", (long long)D,
                  (int)p.rows_log2, rows, 32 * rows);
    } else {
      std::printf("    D=%lld: rows_log2=%d, a block per row of %d threads\n", (long long)D, (int)p.rows_log2, p.threads);
    }
  }
}
""")
    src = cache / "plan.cpp"
    src.write_text(program)
    print("layernorm_gelu_a: its plan code compiled by the host compiler (g++ -O2)")
    for flag, host in (("-fsigned-char", "x86-64 (char signed)"), ("-funsigned-char", "aarch64 (char unsigned)")):
        exe = cache / f"plan{flag}"
        built = subprocess.run(["g++", "-O2", flag, str(src), "-o", str(exe)], capture_output=True, text=True)
        if built.returncode:
            print(f"  {host}: compile failed: {built.stderr[-300:]}")
            continue
        print(f"  {host}:")
        print(subprocess.run([str(exe)], capture_output=True, text=True).stdout.rstrip())


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="attacks-v11-host-") as tmp:
        cache = Path(tmp)
        softmax(cache)
        swiglu(cache)
        gelu(cache)
        layernorm(cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
