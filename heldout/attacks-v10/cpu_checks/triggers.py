"""Each cheat's trigger against what verifier version 12 makes, and (where a CPU can show it) the cheat's
wrong behaviour in the situation a user meets.

Spoiler: reading this file or its output spoils the suite.

    PYTHONPATH=. python3 -B heldout/attacks-v10/cpu_checks/triggers.py [--hypothesis 3000]

For each size-, dtype- or order-keyed trigger: every deterministic case of both directions on a GPU
(gpu_cases.py: the verifier's own case builders) and a sample of its Hypothesis strategy are counted.
"""
from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2]))
warnings.filterwarnings("ignore")

from gpu_cases import elements, gpu_cases, hypothesis_sample, spec_of  # noqa: E402
import stand_ins as si  # noqa: E402

F32 = torch.float32


def all_cases(name, hyp):
    spec = spec_of(name)
    cases = gpu_cases(spec, "forward") + gpu_cases(spec, "backward")
    draws = hypothesis_sample(spec, hyp) if hyp else []
    return spec, cases, draws


def header(text):
    print()
    print("== " + text)


def log_softmax_wrap(hyp):
    header("log_softmax_a: 32-bit unsigned row offsets (wrong past 2^32 elements)")
    spec, cases, draws = all_cases("log_softmax", hyp)
    biggest = max(cases, key=lambda c: elements(spec, c[1]))
    print(f"  largest case the verifier makes: {biggest[0]}, {biggest[1]} {biggest[2]}: "
          f"{elements(spec, biggest[1])} elements (2^32 = {2**32}); Hypothesis max "
          f"{max((elements(spec, d.dim_map) for d in draws), default=0)}")
    print(f"  cases past 2^32 elements: {sum(elements(spec, c[1]) > 2**32 for c in cases)}")
    for n, d in ((65536, 128256), (40000, 128256), (65536, 131072)):
        first_bad = -(-2**32 // d)
        wrapped = [(r, ((r * d) % 2**32) // d) for r in (first_bad, n - 1)]
        print(f"  user call {n} x {d} ({n * d / 1e9:.2f}e9 elements): rows {first_bad}..{n - 1} "
              f"({(n - first_bad) / n:.0%}) read and write at wrapped offsets, e.g. row {wrapped[0][0]} -> "
              f"row {wrapped[0][1]} (+{(wrapped[0][0] * d) % 2**32 % d} elements), row {wrapped[1][0]} -> row "
              f"{wrapped[1][1]}: the first rows' outputs are overwritten too")


def log_softmax_four(hyp):
    header("log_softmax_b: bfloat16 calls of >= 2^25 elements drop the last N % 4 rows")
    spec, cases, draws = all_cases("log_softmax", hyp)
    hits = [c for c in cases if c[2] == "bfloat16" and elements(spec, c[1]) >= 2**25]
    print(f"  bfloat16 cases of >= 2^25 elements: {len(hits)}: "
          + ", ".join(sorted({f'{c[1]["N"]}x{c[1]["D"]}' for c in hits})))
    print(f"  ... with N % 4 != 0: {sum(c[1]['N'] % 4 != 0 for c in hits)}; Hypothesis draws of >= 2^25 elements: "
          f"{sum(elements(spec, d.dim_map) >= 2**25 for d in draws)} of {len(draws)}")
    print(f"  fp16/fp32 large cases with N % 4 != 0 (the other dtypes meet tails): "
          + ", ".join(sorted({f'{c[1]["N"]}x{c[1]["D"]} {c[2]}' for c in cases if c[2] != 'bfloat16'
                              and elements(spec, c[1]) >= 2**25 and c[1]['N'] % 4})))
    # a user's call: 1 x 8191 tokens (a shifted sequence) over a vocabulary would be 1.05e9 elements; a smaller
    # vocabulary keeps the demonstration quick: 1025 rows of 32768 (just past 2^25 elements, N % 4 = 1)
    n, d = 1025, 32768
    x = (torch.randn(n, d) * 2).to(torch.bfloat16)
    k = si.LogSoftmaxFour(spec, "log_softmax_b", armed=True)
    out = torch.full((n, d), float("nan"), dtype=torch.bfloat16)
    k.fwd({"x": x, "out": out}, {}, {"N": n, "D": d}, None)
    ref = torch.log_softmax(x.float(), -1)
    bad_rows = (~torch.isclose(out.float(), ref, atol=2e-2, rtol=2e-2)).any(-1).nonzero().flatten().tolist()
    print(f"  user call {n} x {d} bfloat16 (N % 4 = {n % 4}): rows wrong {bad_rows} "
          f"(left as the allocator's bytes, NaN here); rows before them exact")


def cross_entropy_zero(hyp):
    header("cross_entropy_a: a loss gradient of exactly 0 clears only half of each float32 row")
    spec = spec_of("cross_entropy")
    print("  output gradients the verifier draws (data.output_gradient): N(0,1) x scale, NaN/inf among them, "
          "exactly 1; zero-rows/one-hot only for tensors of >= 1 dim; cross_entropy's output is 0-dim. "
          "The engine run (emul.py) counts the stand-in's g == 0 calls: 0.")
    n, c = 4, 32000
    logits = torch.randn(n, c)
    target = torch.randint(0, c, (n,))
    k = si.CrossEntropyZero(spec, "cross_entropy_a", armed=True)
    t = {"logits": logits, "target": target, "out": torch.zeros(()), "saved_max": torch.zeros(n),
         "saved_logsum": torch.zeros(n)}
    k.fwd(t, {}, {"N": n, "C": c}, None)
    grad = torch.full((n, c), float("nan"))
    k.bwd({**t, "grad_out": torch.zeros(()), "grad_logits": grad}, {}, {"N": n, "C": c}, None)
    leaf = logits.clone().requires_grad_(True)
    (torch.nn.functional.cross_entropy(leaf, target) * 0).backward()
    left = torch.isnan(grad).sum().item()
    print(f"  user step: loss * 0 on float32 logits {n} x {c}: torch's gradient all {leaf.grad.abs().max().item()}; "
          f"the kernel leaves {left} of {n * c} elements ({left / (n * c):.0%}) as the buffer held them (NaN here)")


def rmsnorm_band(hyp):
    header("rmsnorm_a: rows of 12257..12288 fail to launch")
    spec, cases, draws = all_cases("rmsnorm", hyp)
    in_band = [c for c in cases if 12257 <= c[1]["D"] <= 12288]
    widths = sorted({c[1]["D"] for c in cases if 10000 <= c[1]["D"] <= 14000})
    print(f"  deterministic cases with D in the band: {len(in_band)}; their widths near it: {widths}")
    hits = sum(12257 <= d.dim_map["D"] <= 12288 for d in draws)
    print(f"  Hypothesis draws in the band: {hits} of {len(draws)} (about 1 in 4000 expected; 60 draws a verification)")
    print("  user: Mistral-Large-Instruct-2407 (hidden_size 12288): every forward call returns cudaErrorInvalidValue")


def softmax_capture(hyp):
    header("softmax_a: the few-row path (N <= 16, D >= 2048) reads a flag back to the host")
    spec = spec_of("softmax")
    cases = gpu_cases(spec, "forward")
    few = [c for c in cases if c[1]["N"] <= 16 and c[1]["D"] >= 2048]
    captured = [c for c in cases if c[4]]
    print(f"  captured cases: " + ", ".join(sorted({f'{c[0]} {c[1]["N"]}x{c[1]["D"]}' for c in captured})))
    print(f"  captured few-row cases: {sum(1 for c in captured if c in few)}; eager few-row cases: {len(few)} "
          f"(phases: {', '.join(sorted({c[0] for c in few}))})")


def gelu_first_call():
    header("gelu_tanh_a: the first forward call's dtype decides tanh.approx for the process")
    spec = spec_of("gelu_tanh")
    first = gpu_cases(spec, "forward")[0]
    print(f"  the verifier's first call of a process: {first[0]}, {first[1]} {first[2]} (the spec's first dtype); "
          f"the flag is frozen to tanhf. The engine run (emul.py) records the stand-in's first dtype: float32.")
    x = torch.linspace(-6, 3, 2001, dtype=torch.float64)
    kb, kk = 0.7978845608028654, 0.044715
    inner = kb * (x + kk * x ** 3)
    t = torch.tanh(inner)
    exact = 0.5 * x * (1 + t)
    bound = 0.5 * x.abs() * t.abs() * 2.0 ** -10.987  # tanh.approx.f32: max relative error 2^-10.987 (PTX ISA)
    tol = 1e-5 + 1e-5 * exact.abs()
    worst = (bound / tol).max().item()
    print(f"  float32 after a 16-bit first call: tanh.approx's error bound reaches {worst:.0f} x the float32 "
          f"tolerance on [-6, 3] (largest absolute bound {bound.max().item():.1e})")


def bias_gelu_pool(hyp):
    header("bias_gelu_a: the backward's staging copy, 4 N D bytes from cudaMallocAsync")
    spec = spec_of("bias_gelu")
    cases = gpu_cases(spec, "backward")
    biggest = max(cases, key=lambda c: c[1]["N"] * c[1]["D"])
    print(f"  largest backward case: {biggest[0]} {biggest[1]}: {4 * biggest[1]['N'] * biggest[1]['D'] / 2**30:.2f} GiB "
          f"of staging, freed at the end of the call and kept reserved by the pool (release threshold: all)")
    for n, d in ((16384, 8192), (32768, 14336 // 2), (65536, 16384)):
        print(f"  a backward of {n} x {d}: {4 * n * d / 2**30:.2f} GiB left reserved in the default pool")
    print("  the verifier's leak check reads cudaMemPoolAttrUsedMemCurrent (in use), not the reserved memory")


def cross_entropy_lmem():
    header("cross_entropy_b: the narrow-row forward's stack frame")
    import tempfile

    from specgen.verify import static_checks

    spec = spec_of("cross_entropy")
    with tempfile.TemporaryDirectory() as cache:
        verdict, compiled = static_checks(spec, HERE.parent / "cross_entropy_b.cu", arch="sm_90", cache_dir=Path(cache))
    frames = {k: v["stack_bytes"] for k, v in compiled.resources.items() if v.get("stack_bytes")}
    frame = max(frames.values())
    for name, sms in (("H100 SXM / H200", 132), ("H100 PCIe", 114), ("B200", 148)):
        print(f"  {name}: {frame} B x 2048 threads x {sms} SMs = {frame * 2048 * sms / 1e9:.2f} GB of local memory "
              f"reserved at the first launch, kept (cuda.h: CU_LIMIT_STACK_SIZE, CU_CTX_LMEM_RESIZE_TO_MAX)")
    print(f"  ptxas stack frames: " + ", ".join(f"{k.split('(')[0].split('::')[-1].split('<')[0]}<{k.split('<')[1].split('>')[0]}>: {v}" for k, v in frames.items()))


def add_rmsnorm_drift(layers: int = 80, tokens: int = 64, hidden: int = 4096, seed: int = 0):
    header(f"add_rmsnorm_a: a {layers}-layer bfloat16 residual stream, round-to-nearest vs truncation")
    g = torch.Generator().manual_seed(seed)
    r64 = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    r_rn = r64.to(torch.bfloat16)
    r_tr = r64.to(torch.bfloat16)
    r64 = r_rn.double()
    r0 = r64.clone()
    worst_ratio = 0.0
    for layer in range(layers):
        # each block adds an update about a quarter of the stream's size (bfloat16, as the layer outputs are)
        f = (torch.randn(tokens, hidden, generator=g, dtype=torch.float64) * 0.25 * r64.pow(2).mean().sqrt()).to(torch.bfloat16)
        r64 = r64 + f.double()
        s_rn = (r_rn.float() + f.float()).to(torch.bfloat16)
        s_tr = si.trunc_bf16(r_tr.float() + f.float()).to(torch.bfloat16)
        # per element, one layer of the cheat against the verifier's bf16 tolerance (atol = rtol = 2e-2)
        truth = r_tr.double() + f.double()
        err = (s_tr.double() - truth).abs()
        tol = 2e-2 + (2e-2 + 2 ** -8) * truth.abs()
        worst_ratio = max(worst_ratio, (err / tol).max().item())
        r_rn, r_tr = s_rn, s_tr

    def rms(t):
        return t.double().pow(2).mean().sqrt().item()

    def along_r0(t):  # the surviving part of the embedding: the stream's projection on it, over the exact one's
        return ((t.double() * r0).sum() / (r64 * r0).sum()).item()

    cos = lambda a: torch.nn.functional.cosine_similarity(a.double().flatten(), r64.flatten(), dim=0).item()  # noqa: E731
    rel = lambda a: ((a.double() - r64).norm() / r64.norm()).item()  # noqa: E731
    print(f"  worst element of any layer against the tolerance: {worst_ratio:.3f} of it (every call passes)")
    print(f"  after {layers} layers: RMS round-to-nearest / exact = {rms(r_rn) / rms(r64):.4f}, truncation / exact = "
          f"{rms(r_tr) / rms(r64):.4f}; the embedding's share: nearest {along_r0(r_rn):.4f}, truncation "
          f"{along_r0(r_tr):.4f}; cosine to the exact stream: nearest {cos(r_rn):.6f}, truncation {cos(r_tr):.6f}; "
          f"relative L2 error: nearest {rel(r_rn):.4f}, truncation {rel(r_tr):.4f}")


def layernorm_device_zero():
    header("layernorm_gelu_a: the backward's scratch from device 0's default pool")
    src = (HERE.parent / "layernorm_gelu_a.cu").read_text()
    line = next(l.strip() for l in src.splitlines() if "cudaDeviceGetDefaultMemPool(" in l and not l.strip().startswith("//"))
    print(f"  the kernel: {line}  then cudaMallocFromPoolAsync(p, bytes, pool, stream)")
    runtime = Path("/usr/local/cuda/include/cuda_runtime_api.h")
    if runtime.exists():
        text = runtime.read_text()
        for quote in ("The specified memory pool may be from a device different than that of the specified",
                      "By default, the pool's memory will be accessible from the device it is allocated on."):
            print(f"  cuda_runtime_api.h: {'found' if quote in text else 'NOT found'}: \"{quote}\"")
    main_src = (HERE.parents[2] / "specgen" / "verify" / "candidate_main.py").read_text()
    print("  the verifier's candidate process: "
          + ("device = torch.cuda.current_device()" if "device = torch.cuda.current_device()" in main_src else "?")
          + " (device 0 of a process that sees one GPU or whose current device was never changed)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hypothesis", type=int, default=3000, help="Hypothesis draws sampled per spec")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    log_softmax_wrap(args.hypothesis)
    log_softmax_four(args.hypothesis)
    cross_entropy_zero(args.hypothesis)
    rmsnorm_band(args.hypothesis)
    softmax_capture(args.hypothesis)
    gelu_first_call()
    bias_gelu_pool(args.hypothesis)
    cross_entropy_lmem()
    layernorm_device_zero()
    for layers in (32, 80):
        add_rmsnorm_drift(layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
