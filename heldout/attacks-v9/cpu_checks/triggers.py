"""Run from the repository root: python -B heldout/attacks-v9/cpu_checks/triggers.py

On the CPU, each arithmetic cheat's stand-in (cpu_checks/stand_ins.py) on the situation that
triggers it, against the float64 truth and the spec's tolerance as the verifier writes it
(|got - truth| <= atol + (rtol + eps) * |truth|, no widening); and, where the same stand-in runs
the verifier's own classes at that shape, that they stay within it. Also two host-side cheats whose
trigger needs no GPU (gelu_tanh_a's thread affinity, through its compiled library; cross_entropy_a's
write index). Nothing here runs CUDA code on a device."""
import ctypes
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import stand_ins as si  # noqa: E402
from specgen.inputs import make_inputs  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify.compare import compare  # noqa: E402

F64 = torch.float64


def spec(name):
    return load_spec(SUITE / "specs" / f"{name}.yaml")


def judged(got, truth, reference, sp, dtype_name):
    """The verifier's own comparison (specgen.verify.compare.compare: the spec's tolerance, widened by
    the working-dtype reference's error): 'within', or how many elements fall outside and the worst."""
    tol = sp.tolerance_for(dtype_name)
    bad = compare(got, truth, tol.atol, tol.rtol, reference=reference)
    if bad is None:
        return "within the tolerance"
    return (f"{bad.bad}/{bad.total} outside (worst: expected {bad.expected:.6g}, got {bad.got:.6g}"
            f"{'; ' + bad.where[-1] if bad.where else ''})")


def layernorm_offset():
    sp = spec("layernorm_gelu")
    print("layernorm_gelu_a: one-pass variance, rows of mean m and spread 1 (64 x 4096, float32, eps 1e-5)")

    def run(x, w, b, one_pass):
        t = {"x": x, "weight": w, "bias": b, "out": torch.empty_like(x)}
        si.ln_fwd(t, {"eps": 1e-5}, {}, one_pass_above=1024 if one_pass else None)
        truth = F.gelu(F.layer_norm(x.double(), (x.shape[1],), w.double(), b.double(), 1e-5), approximate="tanh")
        ref = F.gelu(F.layer_norm(x, (x.shape[1],), w, b, 1e-5), approximate="tanh")
        return judged(t["out"], truth, ref, sp, "float32")

    for offset in (0.0, 10.0, 30.0, 100.0, 1000.0):
        g = torch.Generator().manual_seed(1)
        x = (offset + torch.randn(64, 4096, generator=g, dtype=F64)).float()
        w, b = torch.ones(4096), torch.zeros(4096)
        print(f"  m = {offset:6.0f}: one-pass {run(x, w, b, True)}; two-pass {run(x, w, b, False)}")
    # the verifier's own classes at the same width: the one-pass stays within
    for cls in ("normal", "negative", "sparse", "uniform", "large", "huge", "outliers", "int8", "repeated", "tiny"):
        args = make_inputs(sp.signature, {"N": 64, "D": 4096}, "float32", seed=3, distribution=cls)
        print(f"  verifier class {cls:9s}: one-pass {run(args['x'], args['weight'], args['bias'], True)}")


def rmsnorm_zero_rows():
    print("rmsnorm_b: a row of zeros (D = 4096, float32)")
    x = torch.randn(4, 4096)
    x[2] = 0.0
    w = torch.ones(4096)
    t = {"x": x, "weight": w, "out": torch.empty_like(x), "saved_rstd": torch.empty(4)}
    si.rms_fwd(t, {"eps": 1e-6}, {}, scaled_above=256)
    print(f"  zero row: out NaN {int(torch.isnan(t['out'][2]).sum())} of 4096, saved_rstd {float(t['saved_rstd'][2])}"
          f" (torch: 0 and {1 / math.sqrt(1e-6):.1f}); other rows NaN: {int(torch.isnan(t['out'][[0, 1, 3]]).sum())}")
    sp = spec("rmsnorm")
    zero_rows = 0
    for seed in range(200):
        args = make_inputs(sp.signature, {"N": 64, "D": 257}, "float32", seed=seed, distribution="sparse")
        zero_rows += int((args["x"] == 0).all(-1).sum())
    print(f"  the verifier's 'sparse' class, 200 draws of 64 rows of 257: {zero_rows} all-zero rows")


def add_rmsnorm_eps():
    sp = spec("add_rmsnorm")
    print("add_rmsnorm_a: eps = 1e-5 (Llama's) in a call of 2^22 elements (1024 x 4096), residual stream of RMS r")
    ref_fn = sp.reference_fn()
    for dtype_name, dt in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        for rms in (0.003, 0.01, 0.03, 0.1, 0.3, 1.0):
            N, D = 1024, 4096
            g = torch.Generator().manual_seed(2)
            x = (rms * torch.randn(N, D, generator=g)).to(dt)
            r = (rms * torch.randn(N, D, generator=g)).to(dt)
            w = (1 + 0.1 * torch.randn(D, generator=g)).to(dt)
            t = {"x": x, "residual": r, "weight": w, "out": torch.empty_like(x), "residual_out": torch.empty_like(x),
                 "saved_rstd": torch.empty(N)}
            si.addrms_fwd(t, {"eps": 1e-5}, {}, big_eps=1e-6)
            truth, _ = ref_fn(x.double(), r.double(), w.double(), 1e-5)
            ref, _ = ref_fn(x, r, w, 1e-5)
            print(f"  {dtype_name:8s} r = {rms:5.3f}: {judged(t['out'], truth, ref, sp, dtype_name)}")


def log_softmax_one_hot():
    sp = spec("log_softmax")
    print("log_softmax_b: backward of nll_loss(log_softmax(x), t): one non-zero gradient per row (8 x 32000, float32)")
    N, D = 8, 32000
    g0 = torch.Generator().manual_seed(4)
    x = torch.randn(N, D, generator=g0, dtype=F64).float()

    def run(grad, shortcut):
        x64 = x.double().requires_grad_(True)
        (truth,) = torch.autograd.grad(torch.log_softmax(x64, -1), x64, grad.double())
        x32 = x.clone().requires_grad_(True)
        out32 = torch.log_softmax(x32, -1)
        (ref,) = torch.autograd.grad(out32, x32, grad)
        t = {"out": out32.detach(), "grad_out": grad, "grad_x": torch.empty(N, D)}
        (si.log_softmax_bwd_chunks if shortcut else si.log_softmax_bwd)(t, {}, {})
        return judged(t["grad_x"], truth, ref, sp, "float32")

    tgt = torch.randint(0, D, (N,), generator=g0)
    one_hot = torch.zeros(N, D).scatter_(1, tgt[:, None], -1.0 / N)
    print(f"  one-hot gradient: shortcut {run(one_hot, True)}; honest {run(one_hot, False)}")
    rows = torch.randn(N, D, generator=g0)
    rows[1::3] = 0.0  # the verifier's "zero-rows" gradients
    print(f"  'zero-rows' gradient: shortcut {run(rows, True)}")
    print(f"  N(0, 1) gradient: shortcut {run(torch.randn(N, D, generator=g0), True)}")


def cross_entropy_index():
    print("cross_entropy_a: the backward's fix-up writes grad[row * C + target[row]]")
    C = 32000
    for row, t in ((0, -100), (5, -100)):
        at = row * C + t
        where = "before grad_logits (another tensor)" if at < 0 else f"row {at // C}, column {at % C}"
        print(f"  row {row}, label {t}: element {at}: {where}")


def gelu_affinity():
    print("gelu_tanh_a: the calling thread's CPU affinity around one call (its compiled library, no GPU needed)")
    from specgen.verify import static_checks

    sp = spec("gelu_tanh")
    cache = Path(os.environ.get("SPECGEN_CACHE_DIR", "/tmp/specgen-v9-cache"))
    verdict, compiled = static_checks(sp, SUITE / "gelu_tanh_a.cu", arch="sm_90", cache_dir=cache)
    if compiled is None:
        print(f"  could not compile: {verdict}")
        return
    lib = ctypes.CDLL(str(compiled.library))
    fn = lib.gelu_tanh_forward
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
    buf = ctypes.create_string_buffer(4096)  # a zeroed argument struct: N = D = 0, nothing launched
    before = os.sched_getaffinity(0)
    code = fn(ctypes.addressof(buf), None)
    after = os.sched_getaffinity(0)
    print(f"  before: {len(before)} CPUs {sorted(before)[:8]}...; returned {code}; after: {len(after)} CPUs "
          f"{sorted(after)}")
    os.sched_setaffinity(0, before)


if __name__ == "__main__":
    torch.set_num_threads(1)
    layernorm_offset()
    rmsnorm_zero_rows()
    add_rmsnorm_eps()
    log_softmax_one_hot()
    cross_entropy_index()
    gelu_affinity()
