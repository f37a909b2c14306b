"""Python stand-ins for compiled kernels, so the verifier's logic runs on a CPU.

A `PyKernel` has the interface the verifier calls on a loaded library (`call`, `has`,
`error_name`, `clear_error`); its `impl` writes the outputs in place, honestly or with one
of the cheats the adversarial .cu kernels commit on the GPU.
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F


class PyKernel:
    def __init__(self, spec, impl, backward=None):
        self.spec, self.impl, self.backward_impl = spec, impl, backward or gelu_backward
        self.calls = 0

    def has(self, direction: str) -> bool:
        return True

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.calls += 1
        fn = self.impl if direction == "forward" else self.backward_impl
        return int(fn(self, tensors, dims) or 0)

    def error_name(self, code: int) -> str:
        return {9: "cudaErrorInvalidConfiguration", 700: "cudaErrorIllegalAddress"}.get(code, f"cudaError {code}")

    def clear_error(self) -> None:
        pass


class StaticScratchKernel(PyKernel):
    """GELU in two launches through one buffer that outlives the call (a static __device__
    array in CUDA) instead of the workspace: correct one call at a time. `steps` gives the two
    launches, so the CPU stand-in runner interleaves them with another call's as two streams
    on a GPU do (A1, B1, A2, B2): call A then copies call B's values."""

    def __init__(self, spec):
        super().__init__(spec, self.forward)
        self.scratch = None

    def steps(self, direction, tensors, scalars, dims):
        if direction != "forward":
            return [lambda: self.call(direction, tensors, scalars, dims, None)]

        def compute():
            self.scratch = _gelu(tensors["x"]).clone()

        def copy_out():
            tensors["out"].copy_(self.scratch.view_as(tensors["out"]))
        return [compute, copy_out]

    @staticmethod
    def forward(k, t, dims):
        for step in k.steps("forward", t, {}, dims):
            step()


def _gelu(x):
    return F.gelu(x.float(), approximate="tanh").to(x.dtype)


def gelu_forward(k, t, dims):
    t["out"].copy_(_gelu(t["x"]))


def gelu_backward(k, t, dims):
    x = t["x"].detach().float().clone().requires_grad_(True)
    with torch.enable_grad():
        y = F.gelu(x, approximate="tanh")
        (g,) = torch.autograd.grad(y, x, t["grad_out"].float())
    t["grad_x"].copy_(g.to(t["grad_x"].dtype))


def does_nothing(k, t, dims):
    return 0


def first_256_only(k, t, dims):
    flat = t["out"].view(-1)
    flat[:256].copy_(_gelu(t["x"]).view(-1)[:256])


def drops_tail(k, t, dims):
    flat = t["out"].view(-1)
    n = flat.numel() // 4 * 4
    flat[:n].copy_(_gelu(t["x"]).view(-1)[:n])


def mutates_input(k, t, dims):
    y = _gelu(t["x"])
    t["x"].copy_(y)
    t["out"].copy_(y)


def half_math(k, t, dims):
    t["out"].copy_(_gelu(t["x"].half()).to(t["out"].dtype))


def noisy(k, t, dims):
    y = _gelu(t["x"])
    if k.calls % 2:  # every other run, one ulp up: an atomics-order difference
        y = torch.nextafter(y, torch.full_like(y, float("inf")))
    t["out"].copy_(y)


def pointer_cache(k, t, dims):
    key = (t["x"].data_ptr(), t["out"].data_ptr(), t["x"].numel())
    state = k.__dict__.setdefault("cache", {"key": None, "repeats": 0})
    if key == state["key"]:
        state["repeats"] += 1
        if state["repeats"] >= 8:
            return 0
    else:
        state["key"], state["repeats"] = key, 1
    gelu_forward(k, t, dims)


def narrow_rows(k, t, dims):
    """Right for rows up to 64 wide; beyond, zeros: a kernel tuned for one shape."""
    y = _gelu(t["x"])
    if dims["D"] > 64:
        y[:, 64:] = 0
    t["out"].copy_(y)


def wraps_offsets_at(mark: int):
    """GELU through an element offset that wraps at `mark` (an `int` offset wraps at 2^31): each
    element past the mark reads the element `mark` before it, so only a tensor larger than
    that goes wrong."""
    def forward(k, t, dims):
        flat = t["x"].reshape(-1)
        index = torch.arange(flat.numel(), device=flat.device) % mark
        t["out"].copy_(_gelu(flat[index]).view_as(t["out"]))
    return forward


def bad_config(k, t, dims):
    return 9


def illegal_address(k, t, dims):
    return 700


def wrong_backward(k, t, dims):
    x = t["x"].float()
    t["grad_x"].copy_((t["grad_out"].float() * 0.5 * (1 + torch.tanh(0.79788456 * (x + 0.044715 * x ** 3))))
                      .to(t["grad_x"].dtype))


def wide_rows_wrong(k, t, dims):
    """Wrong only when D > 300: Hypothesis must find it and shrink D to just above 300."""
    gelu_forward(k, t, dims)
    if dims["D"] > 300:
        t["out"][..., -1] += 1.0


# ---- factories for the worker process (`py:verify_fakes:<name>`)

def correct(spec):
    return PyKernel(spec, gelu_forward)


def segfaults(spec):
    def impl(k, t, dims):
        os.abort()  # the process dies as from a segfault in a kernel library
    return PyKernel(spec, impl)


def hangs(spec):
    def impl(k, t, dims):
        time.sleep(3600)
    return PyKernel(spec, impl)


def lost_context(spec):
    return PyKernel(spec, illegal_address)


# ------------------------------------------------------------------ issue 11's classes, as stand-ins

def nan_inf_to_zero(k, t, dims):
    x = t["x"]
    t["out"].copy_(_gelu(torch.where(torch.isfinite(x), x, torch.zeros_like(x))))


def flushes_huge(k, t, dims):
    x = t["x"]
    t["out"].copy_(torch.where(x.abs() > 1000, torch.zeros_like(x), _gelu(x)))


def wrong_for_mid_widths(k, t, dims):
    y = _gelu(t["x"])
    if 5000 <= dims["D"] < 6000:
        y = y * 1.1
    t["out"].copy_(y)


def idle_after_calls(k, t, dims):
    """Honest for the first 60 calls of the process, idle afterwards (a call counter)."""
    if k.calls > 60:
        return 0
    gelu_forward(k, t, dims)


def wrong_after_many_calls(k, t, dims):
    """Honest for the first 6000 calls of the process, then the output is off by 1% (a time
    bomb: after a verification's worth of calls, a long run gets a wrong op; a quick forward-only
    verification makes about 3600 since version 15's groups of three threads)."""
    gelu_forward(k, t, dims)
    if k.calls > 6000:
        t["out"].mul_(1.01)


def rmsnorm_forward_fixed_eps(k, t, dims):
    x = t["x"].float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    t["out"].copy_((y * t["weight"].float()).to(t["out"].dtype))


def rmsnorm_backward(k, t, dims):
    x = t["x"].detach().float().clone().requires_grad_(True)
    w = t["weight"].detach().float().clone().requires_grad_(True)
    eps = k.last_eps
    with torch.enable_grad():
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        gx, gw = torch.autograd.grad(y, (x, w), t["grad_out"].float())
    t["grad_x"].copy_(gx.to(t["grad_x"].dtype))
    t["grad_weight"].copy_(gw.to(t["grad_weight"].dtype))


class RmsKernel(PyKernel):
    """An rmsnorm stand-in that sees its scalars (the fixed-eps cheat ignores them)."""

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.last_eps = scalars.get("eps", 1e-6)
        return super().call(direction, tensors, scalars, dims, stream)


class NotCapturable(PyKernel):
    capturable = False  # the CPU runner reports a failed capture, as a forked stream would


def memo_by_sampled_fingerprint(k, t, dims):
    """Skips the work when 32 sampled input words match the last call's for 8 calls in a row
    and the output's samples still hold the last result (a memo keyed on a fingerprint)."""
    x, out = t["x"].view(-1), t["out"].view(-1)
    n = x.numel()
    at = torch.tensor([i * (n - 1) // 31 for i in range(32)]) if n else torch.zeros(0, dtype=torch.long)
    key = (n, x[at].tolist())
    state = k.__dict__.setdefault("memo", {"key": None, "streak": 0, "out": None})
    state["streak"] = state["streak"] + 1 if key == state["key"] else 1
    state["key"] = key
    if state["streak"] >= 8 and state["out"] is not None and out[at].tolist() == state["out"]:
        return 0
    gelu_forward(k, t, dims)
    state["out"] = out[at].tolist()


MEMO_SMALL_ELEMENTS = 4096  # memo_at_launch_bound_sizes works only up to here


def memo_at_launch_bound_sizes(k, t, dims):
    """A memo only where launches dominate (at most MEMO_SMALL_ELEMENTS elements): a table of
    results keyed on 32 sampled input words; on a hit it writes the remembered output and skips
    the work. Larger calls are computed honestly, so a check at a large case never meets it."""
    x, out = t["x"].view(-1), t["out"].view(-1)
    n = x.numel()
    if n > MEMO_SMALL_ELEMENTS or not n:
        return gelu_forward(k, t, dims)
    at = torch.tensor([i * (n - 1) // 31 for i in range(32)])
    key = (n, str(x.dtype), tuple(x[at].tolist()))
    table = k.__dict__.setdefault("memo_table", {})
    if key in table:
        out.copy_(table[key])
        return 0
    gelu_forward(k, t, dims)
    table[key] = out.clone()
    return 0


class WorkspaceKernel(PyKernel):
    """A stand-in with a size function: `size(dims)` bytes of workspace per call (the verifier
    passes it as tensors["workspace"]); `seen` keeps each call's (direction, bytes asked, bytes
    given or None, first bytes)."""

    def __init__(self, spec, impl, size, backward=None):
        super().__init__(spec, impl, backward)
        self.size, self.seen = size, []

    def workspace_bytes(self, direction, tensors, scalars, dims) -> int:
        return self.size(dims)

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        ws = tensors.get("workspace")
        self.seen.append((direction, self.size(dims), None if ws is None else ws.numel(),
                          None if ws is None else ws[:64].clone()))
        return super().call(direction, tensors, scalars, dims, stream)


def gelu_via_workspace(k, t, dims):
    """Honest: the result goes through the workspace (float32 scratch) to the output."""
    n = t["out"].numel()
    scratch = t["workspace"][:4 * n].view(torch.float32)
    scratch.copy_(_gelu(t["x"]).float().view(-1))
    t["out"].view(-1).copy_(scratch.to(t["out"].dtype))


def counter_kept_in_workspace(k, t, dims):
    """Keeps state in the workspace: zeroes a progress counter on its first call only and resets it
    after each call, so from then on it trusts the counter to be 0 on entry; a counter that is not
    0 says the rows before it are done (a "resume" of a split computation) and they are skipped."""
    counter = t["workspace"][:8].view(torch.int64)
    if k.calls == 1:
        counter.zero_()
    done = abs(int(counter[0].item()))
    flat, want = t["out"].view(-1), _gelu(t["x"]).view(-1)
    start = max(0, min(done, flat.numel()))
    flat[start:].copy_(want[start:])
    counter.zero_()  # "left clean for the next call"


def writes_past_workspace(k, t, dims):
    gelu_forward(k, t, dims)
    ws = t["workspace"]
    # one byte past the end: the guard after the workspace (a view of the arena beyond the tensor)
    ws.as_strided((1,), (1,), ws.storage_offset() + ws.numel()).fill_(0x5A)


# ---- the classes held-out attacks-v5 got past the verifier with (session 26), as CPU stand-ins

def sanitizes_grad_backward(k, t, dims):
    """NaN in the output gradient read as 0 and +-inf clamped to the dtype's largest value."""
    g = t["grad_out"]
    big = torch.finfo(g.dtype).max
    t["grad_out_clean"] = torch.nan_to_num(g.float(), nan=0.0, posinf=big, neginf=-big)
    x = t["x"].detach().float().clone().requires_grad_(True)
    with torch.enable_grad():
        (dx,) = torch.autograd.grad(F.gelu(x, approximate="tanh"), x, t["grad_out_clean"])
    t["grad_x"].copy_(dx.to(t["grad_x"].dtype))


def half_product_backward(k, t, dims):
    """In float16 the product grad * x rounded to half first: past 65504 it overflows."""
    x, g = t["x"], t["grad_out"]
    if x.dtype != torch.float16:
        return gelu_backward(k, t, dims)
    v = x.float()
    gx = (g * x).float()  # half * half: rounded (and overflowed) in half
    tanh = torch.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3))
    inner = 0.7978845608028654 * (1 + 3 * 0.044715 * v * v)
    dx = g.float() * 0.5 * (1 + tanh) + 0.5 * gx * (1 - tanh * tanh) * inner
    t["grad_x"].copy_(dx.to(t["grad_x"].dtype))


def fp8_grid_sniff(k, t, dims):
    """bfloat16 inputs whose blocks of 256 all sit on FP8 E4M3's grid (low 4 mantissa bits zero):
    a cheaper approximation, x * sigmoid(1.702 x)."""
    x = t["x"]
    y = _gelu(x)
    if x.dtype == torch.bfloat16 and x.numel() >= 256:
        flat = x.contiguous().view(-1)
        n = flat.numel() // 256 * 256
        on_grid = ((flat[:n].view(torch.int16) & 0xF) == 0).view(-1, 256).all(-1)
        cheap = (x.float() * torch.sigmoid(1.702 * x.float())).to(x.dtype).view(-1)
        out = y.view(-1).clone()
        blocks = out[:n].view(-1, 256)
        blocks[on_grid] = cheap[:n].view(-1, 256)[on_grid]
        y = out.view(x.shape)
    t["out"].copy_(y)


def zero_tile_skip(k, t, dims):
    """A tile of 64 whose first, middle and last elements are exactly 0 is taken for all zeros."""
    y = _gelu(t["x"]).contiguous().view(-1).clone()
    x = t["x"].contiguous().view(-1)
    n = x.numel() // 64 * 64
    tiles = x[:n].view(-1, 64)
    skipped = (tiles[:, 0] == 0) & (tiles[:, 32] == 0) & (tiles[:, 63] == 0)
    y[:n].view(-1, 64)[skipped] = 0
    t["out"].copy_(y.view(t["out"].shape))


class OffloadingKernel(PyKernel):
    """Exact values, but calls of at most 2^20 elements do their work "on another stream" (in CUDA:
    cudaStreamPerThread, a handle that needs no stream-creating symbol): the stand-in runner
    finishes that work at its next device sync, after anything queued on `stream` behind the call."""

    def __init__(self, spec):
        super().__init__(spec, self.forward)
        self.other_stream: list = []

    @staticmethod
    def forward(k, t, dims):
        if t["x"].numel() > 1 << 20:
            return gelu_forward(k, t, dims)
        k.other_stream.append(lambda: gelu_forward(k, t, dims))
        return 0

    def finish_other_streams(self):
        work, self.other_stream = self.other_stream, []
        for item in work:
            item()


class StagedThroughWorkspace(WorkspaceKernel):
    """Honest: GELU in two launches through the workspace the call is handed (float32 scratch).
    `steps` lets the CPU stand-in runner interleave its launches with another call's."""

    def __init__(self, spec):
        super().__init__(spec, self.forward, lambda dims: 4 * dims["N"] * dims["D"])

    def steps(self, direction, tensors, scalars, dims):
        if direction != "forward":
            return [lambda: self.call(direction, tensors, scalars, dims, None)]
        n = tensors["out"].numel()
        scratch = tensors["workspace"][:4 * n].view(torch.float32)

        def compute():
            scratch.copy_(_gelu(tensors["x"]).float().view(-1))

        def copy_out():
            tensors["out"].view(-1).copy_(scratch.to(tensors["out"].dtype))
        return [compute, copy_out]

    @staticmethod
    def forward(k, t, dims):
        for step in k.steps("forward", t, {}, dims):
            step()


# ---- held-out attacks-v6's cheats on how it is called (heldout/attacks-v6/cpu_checks/emul_memo.py,
# emul_cadence.py), as CPU stand-ins: the runner hands a stand-in the stream a GPU call of its kind
# would get (isolation.CpuStream: `cuda_stream` 0 for the legacy default stream, 2 for
# cudaStreamPerThread) and asks its size function before every call, as the package's binding does

DEFAULT_STREAM_HANDLES = (0, 1, 2)  # the legacy default stream, cudaStreamLegacy, cudaStreamPerThread


class MemoOnDefaultStreams(PyKernel):
    """GELU; on a default stream (a handle in DEFAULT_STREAM_HANDLES) a call that matches one of
    the last 64 made there (input and output pointers, shape, dtype) returns at once, leaving the
    output as it is (rmsnorm_memo_blocking_stream). On a stream of the caller's own: exact."""

    def __init__(self, spec):
        super().__init__(spec, gelu_forward)
        self.seen: list = []
        self.skipped = 0

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        if direction == "forward" and getattr(stream, "cuda_stream", None) in DEFAULT_STREAM_HANDLES:
            x, out = tensors["x"], tensors["out"]
            key = (x.data_ptr(), out.data_ptr(), tuple(x.shape), str(x.dtype))
            if key in self.seen:
                self.skipped += 1
                self.calls += 1
                return 0
            self.seen = (self.seen + [key])[-64:]
        return super().call(direction, tensors, scalars, dims, stream)


def _arguments_key(direction, tensors, scalars, dims):
    """What a size function and the call after it see alike: the argument struct less its
    workspace fields (pointers, shapes, dtypes, scalars, dims)."""
    return (direction, tuple(sorted((name, t.data_ptr(), tuple(t.shape), str(t.dtype))
                                    for name, t in tensors.items() if name != "workspace")),
            tuple(sorted(scalars.items())), tuple(sorted(dims.items())))


class SizeQueryCadence(WorkspaceKernel):
    """GELU through its workspace; keeps the arguments its size function was last asked about and
    counts the calls in a row that each come right after a question about their own arguments
    (add_rmsnorm_size_cadence): from the `wrong_from`-th such call, the package's pattern, the
    output is rounded through float16 (wrong in float32). A size function asked once per staged
    case pairs with at most one call in a row."""

    def __init__(self, spec, wrong_from: int = 4):
        super().__init__(spec, self.forward, lambda dims: 4 * dims["N"] * dims["D"])
        self.asked, self.streak, self.longest, self.wrong_from, self.cheated = None, 0, 0, wrong_from, 0

    def workspace_bytes(self, direction, tensors, scalars, dims) -> int:
        self.asked = _arguments_key(direction, tensors, scalars, dims)
        return super().workspace_bytes(direction, tensors, scalars, dims)

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        paired = self.asked is not None and self.asked == _arguments_key(direction, tensors, scalars, dims)
        self.asked = None
        self.streak = self.streak + 1 if paired else 0
        self.longest = max(self.longest, self.streak)
        return super().call(direction, tensors, scalars, dims, stream)

    @staticmethod
    def forward(k, t, dims):
        gelu_via_workspace(k, t, dims)
        if k.streak >= k.wrong_from:
            k.cheated += 1
            t["out"].copy_(t["out"].half().to(t["out"].dtype))


class GrowingSize(WorkspaceKernel):
    """Honest GELU through its workspace, but its size function answers `step` bytes more each
    time it is asked: the bytes placed when the case is staged fall short of the call's own."""

    def __init__(self, spec, step: int = 256):
        self.asks = 0
        super().__init__(spec, gelu_via_workspace, lambda dims: 4 * dims["N"] * dims["D"] + step * self.asks)

    def workspace_bytes(self, direction, tensors, scalars, dims) -> int:
        self.asks += 1
        return super().workspace_bytes(direction, tensors, scalars, dims)
