"""Checks the installed stable_probe wheel; run from outside the source tree.

On a GPU: the CUDA kernel against the reference (float32, bfloat16, a non-contiguous
input, a side stream), a clear error for a CPU/CUDA mismatch, torch.compile(fullgraph).
Everywhere: the extension loads, its CUDA kernel is registered, opcheck passes.
Exit status 0 only when every check passed.
"""
import sys

import torch
from torch.library import opcheck

import stable_probe

failures = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        failures.append(name)


print(f"torch {torch.__version__}, python {sys.version.split()[0]}, file {stable_probe.__file__}")
check("extension _C loads", stable_probe.HAS_CUDA_KERNELS, repr(getattr(stable_probe, "_LOAD_ERROR", "")))
check("CUDA kernel registered",
      torch._C._dispatch_has_kernel_for_dispatch_key("stable_probe::scale", "CUDA"))
x = torch.randn(5, 7)
check("CPU path", torch.equal(stable_probe.scale(x, 3.0), x * 3.0))
result = opcheck(torch.ops.stable_probe.scale.default, (x, 2.0))
check("opcheck (CPU)", all(v == "SUCCESS" for v in result.values()), str(result))

if torch.cuda.is_available():
    for dtype in (torch.float32, torch.bfloat16):
        for n, d in [(1, 1), (3, 5), (1024, 4096), (0, 8)]:
            xg = torch.randn(n, d, device="cuda", dtype=dtype)
            got = stable_probe.scale(xg, 1.5)
            check(f"cuda {dtype} {n}x{d}", got.dtype == dtype and torch.equal(got, (xg.float() * 1.5).to(dtype)))
    base = torch.randn(64, 130, device="cuda")
    view = base[:, 1:129:2]  # non-contiguous and offset
    check("cuda non-contiguous input", torch.equal(stable_probe.scale(view, 2.0), view * 2.0))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # hold the side stream back: work must queue behind it
        xs = torch.ones(256, 256, device="cuda")
        out = stable_probe.scale(xs, 4.0)
    side.synchronize()
    check("cuda current stream", torch.equal(out, torch.full_like(xs, 4.0)))
    try:
        torch.ops.stable_probe.scale(torch.randn(2, 2, dtype=torch.float64, device="cuda"), 2.0)
        check("dtype error raised", False)
    except RuntimeError as error:
        check("dtype error raised", "float32 or bfloat16" in str(error), str(error).splitlines()[0])
    compiled = torch.compile(lambda t: stable_probe.scale(t, 2.0) + 1, fullgraph=True)
    xc = torch.randn(32, 32, device="cuda")
    check("torch.compile fullgraph", torch.equal(compiled(xc), xc * 2.0 + 1))
    result = opcheck(torch.ops.stable_probe.scale.default, (torch.randn(4, 8, device="cuda"), 2.0))
    check("opcheck (CUDA)", all(v == "SUCCESS" for v in result.values()), str(result))
else:
    print("SKIP GPU checks: no CUDA device")

print("ALL PASSED" if not failures else f"FAILED: {failures}")
sys.exit(1 if failures else 0)
