"""Run from the repository root: python -B heldout/attacks-v8/cpu_checks/triggers_demo.py

The other half of emul_cheats.py: each cheat's stand-in (stand_ins.py; the size-gated ones emulated
here) fed the deployment situation its header names, against the spec's reference in float64. Each
line says whether the cheat's answer is outside the spec's tolerance there (it should be) and, for a
neighbouring ordinary input, inside it (it should be). Not the CUDA code."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import stand_ins as S  # noqa: E402
from specgen.spec import load_spec  # noqa: E402

torch.manual_seed(0)
NAN = float("nan")


def spec(name):
    return load_spec(HERE.parent / "specs" / f"{name}.yaml")


def close(got, want, name, dtype):
    tol = spec(name).tolerance_for(dtype)
    got, want = got.double(), want.double()
    both_nan = torch.isnan(got) & torch.isnan(want)
    ok = ((got - want).abs() <= tol.atol + tol.rtol * want.abs()) | both_nan | (got == want)
    return bool(ok.all())


def report(cheat, situation_ok, ordinary_ok):
    print(f"{cheat:36s} wrong in its situation: {not situation_ok!s:5s}  exact on the ordinary input: {ordinary_ok}")


def grads(name, fn_inputs, grad_outs, wrt):
    ref = spec(name).reference_fn()
    leaves = {k: (v.double().clone().requires_grad_(k in wrt) if v.is_floating_point() else v)
              for k, v in fn_inputs.items()}
    outs = ref(**leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    got = torch.autograd.grad(list(outs), [leaves[k] for k in wrt], [g.double() for g in grad_outs])
    return dict(zip(wrt, got))


# 1. log_softmax: backward on its own forward's output, dense vs one-hot output gradients
def log_softmax_marker():
    x = torch.randn(8, 4096)
    t = {"x": x, "out": torch.empty(8, 4096)}
    k = S.Stand(None, None)
    S.lsm_fwd_with(stamping=True)(k, t, {}, {})
    res = {}
    for kind in ("dense", "nll"):
        if kind == "dense":
            g = torch.randn(8, 4096)
        else:
            g = torch.zeros(8, 4096)
            g[torch.arange(8), torch.randint(0, 4096, (8,))] = -1.0 / 8
        b = {"out": t["out"], "grad_out": g, "grad_x": torch.empty(8, 4096)}
        S.lsm_bwd_with(marker=True)(k, b, {}, {})
        want = grads("log_softmax", {"x": x}, [g], ["x"])["x"]
        res[kind] = close(b["grad_x"], want, "log_softmax", "float32")
    report("log_softmax_own_output_marker", res["dense"], res["nll"])


# 2. log_softmax: a grammar mask (a few allowed ids and the end-of-sequence id at the end)
def log_softmax_interior():
    k = S.Stand(None, None)
    outs = []
    for masked in (True, False):
        x = torch.randn(2, 128256)
        if masked:
            allowed = torch.zeros(128256, dtype=torch.bool)
            allowed[[15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 128009]] = True
            x[:, ~allowed] = float("-inf")
        t = {"x": x, "out": torch.empty_like(x)}
        S.lsm_fwd_with(interior_cheat=True)(k, t, {}, {})
        outs.append(close(t["out"], torch.log_softmax(x.double(), -1), "log_softmax", "float32"))
    report("log_softmax_interior_mask_runs", *outs)


# 3. softmax: rows masked throughout with torch.finfo(dtype).min (HF eager attention's padding)
def softmax_finite_mask():
    k = S.Stand(None, None)
    outs = []
    for masked in (True, False):
        x = torch.randn(4, 64)
        if masked:
            x[1] = torch.finfo(torch.float32).min
        t = {"x": x, "out": torch.empty_like(x)}
        S.sm_fwd_with(True)(k, t, {}, {})
        outs.append(close(t["out"], torch.softmax(x.double(), -1), "softmax", "float32"))
    report("softmax_finite_mask_rows", *outs)


# 4. softmax: causal rows 131072 wide, 1024 rows (the one-pass schedule: 32 segments, plain tree)
def softmax_at_scale():
    def one_pass_nan(row_masked):
        D = row_masked.numel()
        seg = -(-D // 32)
        state = ["e" if bool(row_masked[w * seg:(w + 1) * seg].all()) else "v" for w in range(32)]
        stride = 1
        while stride < 32:
            for i in range(0, 32 - stride, 2 * stride):
                a, b = state[i], state[i + stride]
                state[i] = "n" if "n" in (a, b) or (a == b == "e") else ("e" if a == b == "e" else "v")
            stride *= 2
        return state[0] == "n"
    D = 131072
    queries = torch.arange(0, D, D // 1024)  # 1024 query rows of a causal mask over D keys
    nan_rows = sum(one_pass_nan(torch.arange(D) > q) for q in queries.tolist())
    print(f"{'softmax_masked_rows_at_scale':36s} causal rows of 131072 keys that come out NaN: {nan_rows} of 1024; "
          f"unmasked rows: {int(one_pass_nan(torch.zeros(D, dtype=torch.bool)))} of 1")


# 5. cross_entropy: loss.backward() (grad_out exactly 1) vs a loss scale
def ce_unit():
    N, C = 16, 100
    x = torch.randn(N, C)
    tg = torch.randint(0, C, (N,))
    k = S.Stand(None, None)
    f = {"logits": x, "target": tg, "out": torch.empty(()), "saved_max": torch.empty(N), "saved_logsum": torch.empty(N)}
    S.ce_fwd(k, f, {}, {})
    res = []
    for go in (1.0, 0.37):
        b = {"logits": x, "target": tg, "saved_max": f["saved_max"], "saved_logsum": f["saved_logsum"],
             "grad_out": torch.tensor(go), "grad_logits": torch.empty(N, C)}
        S.ce_bwd_with(True)(k, b, {}, {})
        want = grads("cross_entropy", {"logits": x, "target": tg}, [torch.tensor(go)], ["logits"])["logits"]
        res.append(close(b["grad_logits"], want, "cross_entropy", "float32"))
    report("cross_entropy_unit_grad_out", *res)


# 6. cross_entropy: a call on more rows after a smaller one, on the same workspace
def ce_larger_after_smaller():
    C = 32768
    ws = torch.zeros(S.ce_layout(64, C)["total"], dtype=torch.uint8)
    k = S.SizedStand(None, None)
    fwd = S.ce_fwd_workspace_with(True)
    res = []
    for order in ((21, 64), (64, 21)):
        ws.random_(0, 256)
        k.triggers = 0
        for N in order:
            x = torch.randn(N, C)
            tg = torch.randint(0, C, (N,))
            t = {"logits": x, "target": tg, "out": torch.empty(()), "saved_max": torch.empty(N),
                 "saved_logsum": torch.empty(N), "workspace": ws[:S.ce_layout(N, C)["total"]]}
            fwd(k, t, {}, {"N": N, "C": C})
        res.append(close(t["out"], F.cross_entropy(x.double(), tg), "cross_entropy", "float32"))
    report("cross_entropy_larger_after_smaller", *res)


# 7. add_rmsnorm: padded rows (zero output gradients) in a batch
def add_rmsnorm_zero_rows():
    N, D = 8, 256
    x, r, w = torch.randn(N, D), torch.randn(N, D), torch.randn(D)
    k = S.Stand(None, None)
    f = {"x": x, "residual": r, "weight": w, "out": torch.empty(N, D), "residual_out": torch.empty(N, D),
         "saved_rstd": torch.empty(N)}
    S.arms_fwd(k, f, {}, {})
    res = []
    for padded in (True, False):
        g, go = torch.randn(N, D), torch.randn(N, D)
        if padded:
            g[5:], go[5:] = 0.0, 0.0
        b = {**f, "grad_out": g, "grad_residual_out": go, "grad_x": torch.full((N, D), 7.0),
             "grad_residual": torch.full((N, D), 7.0), "grad_weight": torch.empty(D)}  # 7: what the allocator left
        S.arms_bwd_with(True)(k, b, {}, {})
        want = grads("add_rmsnorm", {"x": x, "residual": r, "weight": w}, [g, go], ["x", "residual", "weight"])
        res.append(close(b["grad_x"], want["x"], "add_rmsnorm", "float32"))
    report("add_rmsnorm_zero_grad_rows", *res)


# 8. rmsnorm: QK-norm rows (65536 rows of 128): the pair schedule's RMS
def rmsnorm_narrow():
    N, D = 65536, 128
    x = torch.randn(N, D) * torch.rand(N, 1) * 3
    w = torch.randn(D)
    ss = (x.double() ** 2).sum(-1)
    pair = ss.view(-1, 2).sum(-1).repeat_interleave(2)  # lanes 0-15 and 16-31 add each other's row in
    r = (1.0 / torch.sqrt(pair / D + 1e-6)).float()
    got = (x * r[:, None]) * w
    want = spec("rmsnorm").reference_fn()(x.double(), w.double(), 1e-6)
    honest = (x * (1.0 / torch.sqrt(ss / D + 1e-6)).float()[:, None]) * w
    report("rmsnorm_narrow_rows_at_scale", close(got, want, "rmsnorm", "float32"),
           close(honest, want, "rmsnorm", "float32"))


# 9. layernorm_gelu: a freshly initialized LayerNorm (weight 1, bias 0)
def layernorm_identity():
    N, D = 32, 256
    x, g = torch.randn(N, D), torch.randn(N, D)
    k = S.Stand(None, None)
    res = []
    for fresh in (True, False):
        w = torch.ones(D) if fresh else torch.ones(D) + 0.01 * torch.randn(D)
        b = torch.zeros(D) if fresh else 0.01 * torch.randn(D)
        t = {"x": x, "weight": w, "bias": b, "grad_out": g, "grad_x": torch.empty(N, D), "grad_weight": torch.empty(D),
             "grad_bias": torch.empty(D)}
        S.ln_bwd_with(True)(k, t, {}, {})
        want = grads("layernorm_gelu", {"x": x, "weight": w, "bias": b}, [g], ["x", "weight", "bias"])
        res.append(close(t["grad_weight"], want["weight"], "layernorm_gelu", "float32"))
    report("layernorm_gelu_identity_affine", *res)


# 10. rope: HF-style tables (position 0 is cos = 1, sin = 0) in a prefill
def rope_identity():
    S_, H, D = 16, 4, 128
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    k = S.Stand(None, None)
    res = []
    for start in (0, 5):
        pos = torch.arange(start, start + S_).float()
        ang = pos[:, None] * inv[None, :]
        c, s = ang.cos(), ang.sin()
        x = torch.randn(S_, H, D)
        t = {"x": x, "cos": c, "sin": s, "out": torch.full((S_, H, D), 7.0)}
        S.rope_fwd_with(True)(k, t, {}, {})
        want = spec("rope").reference_fn()(x.double(), c.double(), s.double())
        res.append(close(t["out"], want, "rope", "float32"))
    report("rope_identity_positions", *res)


if __name__ == "__main__":
    torch.set_num_threads(1)
    for demo in (log_softmax_marker, log_softmax_interior, softmax_finite_mask, softmax_at_scale, ce_unit,
                 ce_larger_after_smaller, add_rmsnorm_zero_rows, rmsnorm_narrow, layernorm_identity, rope_identity):
        demo()
