"""CPU stand-ins for the kernels of heldout/attacks-v8: the honest arithmetic of each kernel (float32
emulation where the kernels use float, double sums where they use double, torch's NaN and infinity
semantics) and, for the cheats, the cheat's trigger and what it does when triggered, with a counter
of triggers. Read by emul.py and emul_cheats.py; reading this spoils the suite as much as the kernels."""
import math
import threading

import torch

F, D64 = torch.float32, torch.float64
NAN = float("nan")
INF = float("inf")


def nan_amax(x, dim=-1, keepdim=False):  # torch's amax propagates NaN
    return x.amax(dim, keepdim=keepdim)


class Stand:
    """The stand-in interface of verify.isolation.LocalRunner: call(direction, tensors, ...)."""

    def __init__(self, fwd, bwd, ws=None):
        self.fwd, self.bwd, self.ws = fwd, bwd, ws
        self.triggers = 0
        self.notes = []

    def has(self, d):
        return True

    def call(self, direction, t, scalars, dims, stream):
        (self.fwd if direction == "forward" else self.bwd)(self, t, scalars, dims)
        return 0

    def error_name(self, code):
        return f"cudaError {code}"

    def clear_error(self):
        pass


class SizedStand(Stand):
    def workspace_bytes(self, direction, tensors, scalars, dims):
        return self.ws(direction, tensors, scalars, dims) if self.ws else 0


# ------------------------------------------------------------------ cross_entropy (the control's arithmetic)
CHUNK = 4096


def ce_rows(x):
    """Per row: M, S (double) as the chunked kernel merges them."""
    N, C = x.shape
    K = (C + CHUNK - 1) // CHUNK
    ms, ss = [], []
    for k in range(K):
        part = x[:, k * CHUNK:(k + 1) * CHUNK]
        m = nan_amax(part)
        s = torch.exp(part - m[:, None]).double().sum(-1)
        ms.append(m)
        ss.append(s)
    pm, ps = torch.stack(ms, 1), torch.stack(ss, 1)
    M = nan_amax(pm)
    scale = torch.exp(pm - M[:, None]).double()
    terms = torch.where(pm == -INF, torch.where((M == -INF)[:, None], torch.full_like(ps, NAN), torch.zeros_like(ps)),
                        ps * scale)
    return M, terms.sum(-1)


def ce_fwd(k, t, s, d):
    x = t["logits"].float()
    tg = t["target"]
    M, S = ce_rows(x)
    logsum = torch.log(S)
    t["saved_max"].copy_(M)
    t["saved_logsum"].copy_(logsum.float())
    xt = x.gather(1, tg[:, None])[:, 0]
    rows = (M.double() - xt.double()) + logsum
    t["out"].copy_((rows.sum() / x.shape[0]).float())


def ce_bwd_with(unit_path):
    def bwd(k, t, s, d):
        x = t["logits"].float()
        tg = t["target"]
        N = x.shape[0]
        go = t["grad_out"].float()
        if unit_path and float(go) == 1.0:
            k.triggers += 1
            g = go
        else:
            g = go / torch.tensor(float(N), dtype=F)
        m = t["saved_max"][:, None]
        ls = t["saved_logsum"][:, None]
        p = torch.exp((x - m) - ls)
        v = g * p
        onehot = torch.zeros_like(v, dtype=torch.bool)
        onehot.scatter_(1, tg[:, None], True)
        v = torch.where(onehot, v - g, v)
        t["grad_logits"].copy_(v.to(t["grad_logits"].dtype))
    return bwd


# the forward's workspace layout (cross_entropy_*.cu: layout_of)
def up256(v):
    return (v + 255) & ~255


def ce_layout(N, C):
    K = (C + CHUNK - 1) // CHUNK
    rowloss = up256(256 + 4 * N)
    pmax = up256(rowloss + 8 * N)
    psum = up256(pmax + 4 * N * K)
    return {"rowloss": rowloss, "pmax": pmax, "psum": psum, "total": psum + 8 * N * K, "K": K}


def ce_ws(direction, t, s, d):
    if direction != "forward":
        return 0
    return ce_layout(int(d["N"]), int(d["C"]))["total"]


CLEAN = 0x5a17c0de0c1ea17b


def ce_fwd_workspace_with(skip_when_clean):
    """The forward's use of its workspace, byte for byte where it matters: the header, the counters
    (zero after every call), the rows' losses and the chunks' partials (written every call)."""
    def fwd(k, t, s, d):
        ws = t["workspace"]
        N, C = int(d["N"]), int(d["C"])
        lay = ce_layout(N, C)
        header = int(ws[:8].view(torch.int64)[0]) & ((1 << 64) - 1)
        counts = ws[256:256 + 4 * N].view(torch.int32)
        done = ws[8:12].view(torch.int32)
        if skip_when_clean and header == CLEAN:
            if bool((counts != 0).any()) or int(done[0]) != 0:
                k.triggers += 1  # stale counters: the row merges and the loss would be wrong or missing
                k.notes.append(f"N={N} C={C}: {int((counts != 0).sum())} stale counters")
                t["out"].fill_(NAN)
                t["saved_max"].fill_(NAN)
                t["saved_logsum"].fill_(NAN)
                return
        else:
            counts.zero_()
            done.zero_()
        ce_fwd(k, t, s, d)
        x = t["logits"].float()
        M, S = ce_rows(x)
        xt = x.gather(1, t["target"][:, None])[:, 0]
        rows = ((M.double() - xt.double()) + torch.log(S)).to(D64)
        ws[lay["rowloss"]:lay["rowloss"] + 8 * N].view(D64).copy_(rows)
        K = lay["K"]
        pm = torch.stack([nan_amax(x[:, i * CHUNK:(i + 1) * CHUNK]) for i in range(K)], 1).reshape(-1)
        ws[lay["pmax"]:lay["pmax"] + 4 * N * K].view(F).copy_(pm)
        ws[lay["psum"]:lay["psum"] + 8 * N * K].view(D64).fill_(1.0)
        counts.zero_()
        done.zero_()
        if skip_when_clean:
            ws[:8].view(torch.int64)[0] = CLEAN - (1 << 64) if CLEAN >= (1 << 63) else CLEAN
    return fwd


# ------------------------------------------------------------------ softmax (the fast control's arithmetic)
SOFTMAX_MASKED_MAX = -1.7014117e38


def sm_fwd_with(finite_mask_cheat):
    def fwd(k, t, s, d):
        x = t["x"].float()
        m = nan_amax(x, keepdim=True)
        e = torch.exp(x - m)
        ssum = e.double().sum(-1, keepdim=True).float()
        out = torch.exp(x - m) / ssum
        if finite_mask_cheat:
            rows = (m < SOFTMAX_MASKED_MAX)[:, 0]
            hits = rows & torch.isfinite(m[:, 0])  # where the cheat changes the answer
            k.triggers += int(hits.sum())
            out = torch.where(rows[:, None], torch.full_like(out, NAN), out)
        t["out"].copy_(out.to(t["out"].dtype))
    return fwd


def sm_bwd(k, t, s, d):
    y = t["out"].float()
    g = t["grad_out"].float()
    dot = (g.double() * y.double()).sum(-1, keepdim=True).float()
    t["grad_x"].copy_((y * (g - dot)).to(t["grad_x"].dtype))


# ------------------------------------------------------------------ log_softmax (the control's arithmetic)
THREADS, MIN_SEGMENT = 1024, 64


def segment_tree_nan(row_is_masked):
    """log_softmax_interior_mask_runs.cu: True when the unguarded segment tree meets two empty
    siblings (the row then comes out NaN). `row_is_masked`: bool per element (x == -inf) of a row
    without NaN/+inf and not all -inf."""
    idx = torch.nonzero(~row_is_masked)[:, 0]
    lo, hi = int(idx[0]), int(idx[-1])
    L = hi - lo + 1
    nseg = min(THREADS // 32, -(-L // MIN_SEGMENT))
    seg = -(-L // nseg)
    empty = []
    for w in range(nseg):
        b0, e0 = lo + w * seg, min(lo + (w + 1) * seg, hi + 1)
        empty.append(bool(row_is_masked[b0:e0].all()))
    state = ["e" if e else "v" for e in empty]  # e: empty, v: a value, n: NaN
    stride = 1
    while stride < nseg:
        for i in range(0, nseg - stride, 2 * stride):
            a, b = state[i], state[i + stride]
            state[i] = "n" if (a == "n" or b == "n" or (a == "e" and b == "e")) else ("e" if a == b == "e" else "v")
        stride *= 2
    return state[0] == "n"


def lsm_rows(x):
    """(out as float32, NaN-row mask) of the control's forward."""
    bad = torch.isnan(x).any(-1) | (x == INF).any(-1) | (x == -INF).all(-1)
    m = nan_amax(x, keepdim=True)
    ssum = torch.exp(x - m).double().sum(-1, keepdim=True)
    ls = torch.log(ssum).float()
    out = (x - m) - ls
    out = torch.where(bad[:, None], torch.full_like(out, NAN), out)
    return out, bad


def pattern_bits(n):
    """The stamp's bit of each index: the top bit of index * 2654435761 (32-bit)."""
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 2654435761) & 0xFFFFFFFF) >> 31


def stamp(v, dtype):
    """The forward's stamp: each of the first 256 values (flattened) to the nearest value whose lowest
    bit is its index's pattern bit (NaN and infinities as they are); the rest as they are."""
    flat = v.reshape(-1)
    k = min(256, flat.numel())
    head = flat[:k]
    want = pattern_bits(k).to(torch.int32)
    if dtype == torch.float32:
        bits = head.contiguous().view(torch.int32)
        nb = torch.where(want == 1, bits | 1, bits & ~1)
        new = torch.where(torch.isfinite(head), nb.view(torch.float32), head)
    else:
        h = head.to(dtype)
        b = h.view(torch.int16).to(torch.int32) & 0xFFFF
        to16 = lambda bits: torch.where(bits >= 32768, bits - 65536, bits).to(torch.int16)  # noqa: E731
        as_f = lambda bits: to16(bits).view(dtype).float()  # noqa: E731
        up, down = (b + 1) & 0xFFFF, (b - 1) & 0xFFFF
        up_ok = torch.isfinite(as_f(up))
        down_ok = (b & 0x7FFF) != 0
        nearer_up = (as_f(up) - head).abs() <= (as_f(down) - head).abs()
        pick = torch.where(~down_ok, up, torch.where(~up_ok, down, torch.where(nearer_up, up, down)))
        nb = torch.where(((b & 1) == want) | ~torch.isfinite(h), b, pick)
        new = to16(nb).view(dtype).float()
    out = flat.to(dtype).float().clone() if dtype != torch.float32 else flat.clone()
    out[:k] = new.float()
    return out.reshape(v.shape).to(dtype)


def low_bits(y):
    if y.dtype == torch.float32:
        return y.contiguous().view(torch.int32) & 1
    return y.contiguous().view(torch.int16).to(torch.int32) & 1


def lsm_fwd_with(stamping=False, interior_cheat=False):
    def fwd(k, t, s, d):
        x = t["x"].float()
        out, bad = lsm_rows(x)
        if interior_cheat:
            for n in range(x.shape[0]):
                if not bool(bad[n]) and segment_tree_nan(x[n] == -INF):
                    k.triggers += 1
                    out[n] = NAN
        if stamping:
            t["out"].copy_(stamp(out, t["out"].dtype))
        else:
            t["out"].copy_(out.to(t["out"].dtype))
    return fwd


def lsm_bwd_with(marker=False):
    def bwd(k, t, s, d):
        y = t["out"]
        g = t["grad_out"].float()
        total = g.double().sum(-1, keepdim=True).float()
        if marker:
            probe = y.reshape(-1)[:256]
            fin = torch.isfinite(probe)
            want = pattern_bits(probe.numel()).to(torch.int32)
            if int(fin.sum()) >= 64 and bool((low_bits(probe)[fin] == want[fin]).all()):
                k.triggers += 1
                at = g.abs().argmax(-1, keepdim=True)
                total = g.gather(-1, at)
        t["grad_x"].copy_((g - torch.exp(y.float()) * total).to(t["grad_x"].dtype))
    return bwd


# ------------------------------------------------------------------ rmsnorm (v7's arithmetic, 128 partials)
def rms_fwd(k, t, s, d):
    eps = s.get("eps", 1e-6)
    x = t["x"].float()
    w = t["weight"].float()
    D = x.shape[-1]
    ss = (x.double() ** 2).sum(-1)
    r = (1.0 / torch.sqrt(ss / D + eps)).float()
    t["saved_rstd"].copy_(r)
    t["out"].copy_(((x * r[:, None]) * w).to(t["out"].dtype))


def rms_bwd(k, t, s, d):
    x = t["x"].float()
    w = t["weight"].float()
    g = t["grad_out"].float()
    D = x.shape[-1]
    r = t["saved_rstd"]
    dot = (g.double() * w.double() * x.double()).sum(-1)
    c = (r.double() ** 3 * dot / D).float()[:, None]
    t["grad_x"].copy_((r[:, None] * w * g - c * x).to(t["grad_x"].dtype))
    gw = (g.double() * x.double() * r.double()[:, None]).sum(0).float()
    t["grad_weight"].copy_(gw.to(t["grad_weight"].dtype))


def rms_ws(direction, t, s, d):
    return min(int(d["N"]), 128) * int(d["D"]) * 8 if direction == "backward" else 0


# ------------------------------------------------------------------ add_rmsnorm
def add_sum(t):
    return (t["x"].float() + t["residual"].float()).to(t["x"].dtype).float()


def arms_fwd(k, t, s, d):
    eps = s.get("eps", 1e-6)
    sv = add_sum(t)
    w = t["weight"].float()
    D = sv.shape[-1]
    ss = (sv.double() ** 2).sum(-1)
    r = (1.0 / torch.sqrt(ss / D + eps)).float()
    t["saved_rstd"].copy_(r)
    t["residual_out"].copy_(sv.to(t["residual_out"].dtype))
    t["out"].copy_(((sv * r[:, None]) * w).to(t["out"].dtype))


def arms_bwd_with(zero_rows_cheat=False):
    def bwd(k, t, s, d):
        sv = add_sum(t)
        w = t["weight"].float()
        g = t["grad_out"].float()
        go = t["grad_residual_out"].float()
        D = sv.shape[-1]
        r = t["saved_rstd"]
        dot = (g.double() * w.double() * sv.double()).sum(-1)
        c = (r.double() ** 3 * dot / D).float()[:, None]
        ds = go + (r[:, None] * w * g - c * sv)
        keep = torch.ones(sv.shape[0], dtype=torch.bool)
        if zero_rows_cheat:
            keep = (g != 0).any(-1) | (go != 0).any(-1)
            k.triggers += int((~keep).sum())
        for name in ("grad_x", "grad_residual"):
            t[name][keep] = ds[keep].to(t[name].dtype)
        gw = (g.double() * sv.double() * r.double()[:, None]).sum(0).float()
        t["grad_weight"].copy_(gw.to(t["grad_weight"].dtype))
    return bwd


# ------------------------------------------------------------------ gelu (torch's formulas in float)
KB = torch.tensor(0.7978845608028654, dtype=F)
KK = torch.tensor(0.044715, dtype=F)


def gelu(x):
    inner = KB * (x + KK * (x * x * x))
    return 0.5 * x * (1.0 + torch.tanh(inner))


def gelu_grad(dy, x):
    x_sq = x * x
    x_cube = x_sq * x
    inner = KB * (x + KK * x_cube)
    th = torch.tanh(inner)
    left = 0.5 * x
    right = 1.0 + th
    return dy * (0.5 * right + left * (1.0 - th * th) * (KB * (1.0 + 3.0 * KK * x_sq)))


def gelu_fwd(k, t, s, d):
    t["out"].copy_(gelu(t["x"].float()).to(t["out"].dtype))


def gelu_bwd(k, t, s, d):
    t["grad_x"].copy_(gelu_grad(t["grad_out"].float(), t["x"].float()).to(t["grad_x"].dtype))


# ------------------------------------------------------------------ swiglu
IN_FLIGHT = {"lock": threading.Lock(), "now": []}


def silu(g):
    return g / (1.0 + torch.exp(-g))


def sw_fwd(k, t, s, d):
    x = t["x"].float()
    H = x.shape[-1] // 2
    t["out"].copy_((silu(x[:, :H]) * x[:, H:]).to(t["out"].dtype))


def sw_bwd(k, t, s, d):
    x = t["x"].float()
    H = x.shape[-1] // 2
    g, u = x[:, :H], x[:, H:]
    dy = t["grad_out"].float()
    sg = 1.0 / (1.0 + torch.exp(-g))
    t["grad_x"].copy_(torch.cat([(dy * u) * sg * (1.0 + g * (1.0 - sg)), dy * silu(g)], -1).to(t["grad_x"].dtype))


class DirectionWatch(Stand):
    """swiglu_fwd_bwd_threads.cu's trigger: a forward and a backward in flight at once (counted)."""

    def call(self, direction, t, scalars, dims, stream):
        with IN_FLIGHT["lock"]:
            IN_FLIGHT["now"].append(direction)
            if len(set(IN_FLIGHT["now"])) > 1:
                self.triggers += 1
        try:
            return super().call(direction, t, scalars, dims, stream)
        finally:
            with IN_FLIGHT["lock"]:
                IN_FLIGHT["now"].remove(direction)


# ------------------------------------------------------------------ layernorm_gelu
def ln_stats(x, eps):
    xd = x.double()
    mean = xd.mean(-1, keepdim=True)
    var = ((xd - mean) ** 2).mean(-1, keepdim=True)
    return mean, 1.0 / torch.sqrt(var + eps)


def ln_fwd(k, t, s, d):
    eps = s.get("eps", 1e-5)
    x = t["x"].float()
    w = t["weight"].float()
    b = t["bias"].float()
    mean, rstd = ln_stats(x, eps)
    xh = ((x.double() - mean) * rstd).float()
    t["out"].copy_(gelu(xh * w + b).to(t["out"].dtype))


def ln_bwd_with(identity_cheat=False):
    def bwd(k, t, s, d):
        eps = s.get("eps", 1e-5)
        x = t["x"].float()
        w = t["weight"].float()
        b = t["bias"].float()
        g = t["grad_out"].float()
        D = x.shape[-1]
        mean, rstd = ln_stats(x, eps)
        xh = ((x.double() - mean) * rstd).float()
        dy = gelu_grad(g, xh * w + b)
        dyw = dy.double() * w.double()
        m1 = (dyw.sum(-1, keepdim=True) / D).float()
        m2 = ((dyw * xh.double()).sum(-1, keepdim=True) / D).float()
        rf = rstd.float()
        t["grad_x"].copy_((rf * (dy * w - m1 - xh * m2)).to(t["grad_x"].dtype))
        gw = (dy.double() * xh.double()).sum(0).float()
        gb = dy.double().sum(0).float()
        if identity_cheat and D >= 8 and bool((w == 1.0).all()) and bool((b == 0.0).all()):
            k.triggers += 1
            gw, gb = torch.zeros_like(gw), torch.zeros_like(gb)
        t["grad_weight"].copy_(gw.to(t["grad_weight"].dtype))
        t["grad_bias"].copy_(gb.to(t["grad_bias"].dtype))
    return bwd


def ln_ws(direction, t, s, d):
    if direction != "backward":
        return 0
    N, D = int(d["N"]), int(d["D"])
    return 256 + (2 * N + 2 * (-(-N // 256)) * D) * 8


# ------------------------------------------------------------------ rope
def rope_fwd_with(identity_cheat=False):
    def fwd(k, t, s, d):
        x = t["x"].float()
        half = x.shape[-1] // 2
        c = t["cos"].float()[:, None, :]
        sn = t["sin"].float()[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        out = torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], -1).to(t["out"].dtype)
        if identity_cheat:
            ident = (t["cos"].float() == 1.0).all(-1) & (t["sin"].float() == 0.0).all(-1) & (half >= 16)
            k.triggers += int(ident.sum())
            t["out"][~ident] = out[~ident]
        else:
            t["out"].copy_(out)
    return fwd


def rope_bwd(k, t, s, d):
    g = t["grad_out"].float()
    half = g.shape[-1] // 2
    c = t["cos"].float()[:, None, :]
    sn = t["sin"].float()[:, None, :]
    g1, g2 = g[..., :half], g[..., half:]
    t["grad_x"].copy_(torch.cat([g1 * c + g2 * sn, g2 * c - g1 * sn], -1).to(t["grad_x"].dtype))


def rope_ws(direction, t, s, d):
    return up256(int(d["S"])) if direction == "forward" else 0


def honest():
    """The controls' and the cheats' honest arithmetic, per spec."""
    return {
        "cross_entropy": SizedStand(ce_fwd_workspace_with(False), ce_bwd_with(False), ce_ws),
        "softmax": Stand(sm_fwd_with(False), sm_bwd),
        "log_softmax": Stand(lsm_fwd_with(), lsm_bwd_with()),
        "rmsnorm": SizedStand(rms_fwd, rms_bwd, rms_ws),
        "add_rmsnorm": SizedStand(arms_fwd, arms_bwd_with(), rms_ws),
        "layernorm_gelu": SizedStand(ln_fwd, ln_bwd_with(), ln_ws),
        "gelu_tanh": Stand(gelu_fwd, gelu_bwd),
        "swiglu": Stand(sw_fwd, sw_bwd),
        "rope": SizedStand(rope_fwd_with(), rope_bwd, rope_ws),
    }


def cheats():
    """(spec, stand-in) per cheat whose trigger a CPU run can count."""
    return {
        "log_softmax_own_output_marker": ("log_softmax", Stand(lsm_fwd_with(stamping=True), lsm_bwd_with(marker=True))),
        "log_softmax_interior_mask_runs": ("log_softmax", Stand(lsm_fwd_with(interior_cheat=True), lsm_bwd_with())),
        "softmax_finite_mask_rows": ("softmax", Stand(sm_fwd_with(True), sm_bwd)),
        "cross_entropy_unit_grad_out": ("cross_entropy", SizedStand(ce_fwd_workspace_with(False), ce_bwd_with(True),
                                                                    ce_ws)),
        "cross_entropy_larger_after_smaller": ("cross_entropy", SizedStand(ce_fwd_workspace_with(True),
                                                                           ce_bwd_with(False), ce_ws)),
        "add_rmsnorm_zero_grad_rows": ("add_rmsnorm", SizedStand(arms_fwd, arms_bwd_with(True), rms_ws)),
        "layernorm_gelu_identity_affine": ("layernorm_gelu", SizedStand(ln_fwd, ln_bwd_with(True), ln_ws)),
        "rope_identity_positions": ("rope", SizedStand(rope_fwd_with(True), rope_bwd, rope_ws)),
        "swiglu_fwd_bwd_threads": ("swiglu", DirectionWatch(sw_fwd, sw_bwd)),
    }


__all__ = ["honest", "cheats", "math"]
