"""Which float32 layer norms does the verifier's comparison accept at `huge` inputs? CPU only.

The held-out level-1 problem `layernorm_2d_affine` (session 11) was refused as a wrong result:
one element of 131967 at `huge` float32 inputs (log-uniform magnitudes up to 1e15), where the
bias cancels most of weight x xhat. This study models float32 kernels in torch on the CPU, each
step rounded as a GPU kernel rounds it, and counts the cases the verifier's comparison
(`specgen.verify.compare.compare`, the spec's tolerance widened by the reference's own error)
refuses, beside three precision cheats that must stay refused:

- row sums as `threads` sequential chains then a tree (a block of 1024 threads, or 128);
- the reciprocal square root off by 0, 1 or 2 ulp (CUDA's `rsqrtf` is within 2 ulp; `1.f / sqrtf`
  rounds twice, as torch's CPU layer norm does);
- cheats: bfloat16 inputs, inputs cut to 10 mantissa bits (TF32-like), eps 1e-3 for 1e-5.

    python benchmarks/precision_study.py [--seeds 12] [--out precision_study.json]

Session 12 (the 2-core CPU machine; results/2026-12-02-h200-session12/precision_study.json), 12
seeds of each distribution: 1024 threads with an exact rsqrt: none refused; rsqrt 1 ulp off: 2 of
12 `huge` cases refused, 2 ulp off: 5 of 12; 128 threads: 11 of 12; every cheat refused (eps 1e-3
at `normal` inputs only, as it should: at `huge` inputs eps is nothing beside the variance).
So the generator's `rsqrtf` (in every kernel's prelude) is a likely cause of the held-out
refusal; the next GPU session checks it on the H200 before the prelude changes.

Session 13: the H200 said no (benchmarks/precision_ab.py: `1.f / sqrtf` refused as often as
`rsqrtf`). The generator's looped pass over the odd 131967-wide row runs 512 threads of 258
sequential adds each; modelled here (12 seeds, `huge`): 7 of 12 refused; with 4 partials per
thread (the `chains` variant) 0 of 12, compensated (`kahan`) 0 of 12. On the H200 the default was
refused in 19 of 72 cases and `chains` in 7 of 72 (results/2026-12-02-h200-session13): the model
is optimistic, so `kahan` (partials, each compensated) is the next GPU measurement.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.fsutil import write_atomic  # noqa: E402
from specgen.inputs import make_inputs  # noqa: E402
from specgen.spec import load_spec  # noqa: E402
from specgen.verify.compare import compare  # noqa: E402

SPEC = REPO / "tests" / "builtin_specs" / "layernorm_hw_affine.yaml"
DIMS = {"B": 2, "H": 129, "W": 1023}  # the held-out problem's failing row width, 131967


def chained_sum(values: torch.Tensor, threads: int, partials: int = 1, kahan: bool = False) -> torch.Tensor:
    """float32 sum: `threads` sequential chains (thread t adds elements t, t + threads, ...),
    then a pairwise tree over the chains, as a block reduction does. `partials` > 1: each thread
    keeps that many partial sums, step r going to partial r % partials, folded in order at the end
    (the `chains` variant's looped pass, partials = UNROLL); `kahan`: each chain compensated."""
    whole = values.numel() // threads * threads
    acc = torch.zeros(partials, threads, dtype=values.dtype)
    comp = torch.zeros_like(acc)
    steps = list(values[:whole].reshape(-1, threads))
    rest = values[whole:]
    if rest.numel():
        steps.append(torch.cat([rest, rest.new_zeros(threads - rest.numel())]))
    for r, part in enumerate(steps):
        u = r % partials
        if kahan:
            y = part - comp[u]
            t = acc[u] + y
            comp[u] = (t - acc[u]) - y
            acc[u] = t
        else:
            acc[u] = acc[u] + part
    total = acc[0]
    for u in range(1, partials):
        total = total + acc[u]
    acc = total
    while acc.numel() > 1:
        if acc.numel() % 2:
            acc = torch.cat([acc, acc.new_zeros(1)])
        acc = acc[0::2] + acc[1::2]
    return acc[0]


def modelled_kernel(x, weight, bias, threads: int, rsqrt_ulps: int, partials: int = 1,
                    kahan: bool = False) -> torch.Tensor:
    """A two-pass float32 layer norm over all but the first axis."""
    rows = x.reshape(x.shape[0], -1)
    n = rows.shape[1]
    out = []
    for row in rows:
        mean = chained_sum(row, threads, partials, kahan) / n
        centered = row - mean
        rstd = torch.rsqrt(chained_sum(centered * centered, threads, partials, kahan) / n + 1e-5)
        rstd = (rstd.view(torch.int32) + rsqrt_ulps).view(torch.float32)
        out.append((centered * rstd).reshape(x.shape[1:]) * weight + bias)
    return torch.stack(out)


def candidates() -> dict:
    ln = torch.nn.functional.layer_norm
    return {
        "float32, 1024 threads, exact rsqrt": lambda x, w, b: modelled_kernel(x, w, b, 1024, 0),
        "float32, 1024 threads, rsqrt +1 ulp": lambda x, w, b: modelled_kernel(x, w, b, 1024, 1),
        "float32, 1024 threads, rsqrt +2 ulp": lambda x, w, b: modelled_kernel(x, w, b, 1024, 2),
        "float32, 128 threads, exact rsqrt": lambda x, w, b: modelled_kernel(x, w, b, 128, 0),
        # the generator's looped pass over an odd 131967-wide row: 512 threads, rsqrtf
        "float32, 512 threads (default), rsqrt +1 ulp": lambda x, w, b: modelled_kernel(x, w, b, 512, 1),
        "float32, 512 threads x 4 partials (chains)": lambda x, w, b: modelled_kernel(x, w, b, 512, 1, partials=4),
        "float32, 512 threads, Kahan": lambda x, w, b: modelled_kernel(x, w, b, 512, 1, kahan=True),
        "float32, 512 threads x 4 partials, Kahan": lambda x, w, b: modelled_kernel(x, w, b, 512, 1, partials=4,
                                                                                    kahan=True),
        "cheat: bfloat16 inputs": lambda x, w, b: ln(x.bfloat16(), x.shape[1:], w.bfloat16(), b.bfloat16(),
                                                     1e-5).float(),
        "cheat: 10-bit mantissa inputs": lambda x, w, b: ln((x.view(torch.int32) & ~0x1FFF).view(torch.float32),
                                                            x.shape[1:], w, b, 1e-5),
        "cheat: eps 1e-3": lambda x, w, b: ln(x, x.shape[1:], w, b, 1e-3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    spec = load_spec(SPEC)
    cases = []
    for seed in range(100, 100 + args.seeds):
        for distribution in ("huge", "normal"):
            inputs = make_inputs(spec.signature, DIMS, "float32", seed=seed, distribution=distribution)
            x, w, b = inputs["x"], inputs["weight"], inputs["bias"]
            truth = torch.nn.functional.layer_norm(x.double(), x.shape[1:], w.double(), b.double(), 1e-5)
            reference = torch.nn.functional.layer_norm(x, x.shape[1:], w, b, 1e-5)
            cases.append((distribution, x, w, b, truth, reference))
    rows = []
    for name, fn in candidates().items():
        refused = {"huge": 0, "normal": 0}
        for distribution, x, w, b, truth, reference in cases:
            if compare(fn(x, w, b), truth, 1e-5, 1e-5, reference) is not None:
                refused[distribution] += 1
        rows.append({"candidate": name, "refused_huge": refused["huge"], "refused_normal": refused["normal"],
                     "cases_each": args.seeds})
        print(f"{name:40s} refused: huge {refused['huge']:2d}/{args.seeds}  normal {refused['normal']:2d}/{args.seeds}",
              flush=True)
    if args.out:
        write_atomic(args.out, json.dumps({"dims": DIMS, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
