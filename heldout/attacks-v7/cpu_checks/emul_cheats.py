"""Run from the repository root: python -B heldout/attacks-v7/cpu_checks/emul_cheats.py

The triggers of four cheats counted over the verifier's own cases on the CPU (stand-ins as in
emul.py): a stamped saved_max reaching the backward, a fingerprint match between adjacent rows, a
fully masked row of 16+ elements, an input stride other than D. All four counts should be 0."""
import sys, time
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE)); sys.path.insert(0, str(HERE.parents[2]))
import torch
from emul import *
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

counts = {"stamped_seen_in_bwd": 0, "fingerprint_hits": 0, "fully_masked_ge16": 0, "odd_stride": 0, "calls": 0}

def ce_fwd_stamp(t, s, d):
    ce_fwd(t, s, d)
    if t["logits"].dtype != torch.float32:
        m = t["saved_max"]
        bits = m.view(torch.int32)
        fin = torch.isfinite(m)
        bits.copy_(torch.where(fin, bits | 0xA5, bits))
def ce_bwd_check(t, s, d):
    if t["logits"].dtype != torch.float32:
        bits = t["saved_max"].contiguous().view(torch.int32)
        counts["stamped_seen_in_bwd"] += int(((bits & 0xFF) == 0xA5).sum())
    ce_bwd(t, s, d)

def sm_fwd_g4(t, s, d):
    x = t["x"]; N, D = x.shape
    if D >= 64:
        raw = x.contiguous().view(torch.int16 if x.dtype != torch.float32 else torch.int32)
        for n in range(1, N):
            if n % 4 == 0: continue
            a = torch.cat([raw[n, :8], raw[n, -8:]]); b = torch.cat([raw[n-1, :8], raw[n-1, -8:]])
            if torch.equal(a, b): counts["fingerprint_hits"] += 1
    sm_fwd(t, s, d)

def sm_fwd_g9(t, s, d):
    x = t["x"]; D = x.shape[-1]
    if D >= 16:
        counts["fully_masked_ge16"] += int((x.float() == float("-inf")).all(-1).sum())
    sm_fwd(t, s, d)

def gelu_fwd_g10(t, s, d):
    x = t["x"]
    counts["calls"] += 1
    if x.stride(0) != x.shape[1] and x.shape[1] > 1: counts["odd_stride"] += 1
    gelu_fwd(t, s, d)

runs = [("cross_entropy", Stand(ce_fwd_stamp, ce_bwd_check)), ("softmax", Stand(sm_fwd_g4, sm_bwd)),
        ("softmax", Stand(sm_fwd_g9, sm_bwd)), ("gelu_tanh", Stand(gelu_fwd_g10, gelu_bwd))]
for seed in (3, 11):
    for name, st in runs:
        spec = load_spec(HERE.parent / "specs" / f"{name}.yaml")
        v = run_verification(spec, st, Options(examples=40, budget=1 << 16, seed=seed), device="cpu")
        print(seed, name, v.reason, (v.detail or "")[:300], flush=True)
print(counts)
