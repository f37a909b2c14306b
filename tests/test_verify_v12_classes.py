"""Verifier version 12, on a CPU with Python stand-ins: uncentred rows ("offset"), inputs with whole
zero rows ("zero-rows"), one non-zero output gradient per row ("one-hot"), scalars drawn at full
size, calls from two threads on shapes the process has not met, the calling thread's scheduling
state, and indices outside their declared range (held-out attacks-v9, session 34: each of these
let a cheat through version 11 on the H200)."""
from __future__ import annotations

import dataclasses
import os
import threading

import pytest
import torch
import torch.nn.functional as F

import verify_fakes as fakes
from conftest import SPECS
from specgen.inputs import make_inputs
from specgen.spec import load_spec
from specgen.verify.bad_indices import out_of_range_values, ranged_inputs
from specgen.verify.data import output_gradient, prepare
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import LocalRunner
from specgen.verify.strategies import EVERY_CLASS, scalars_at_scale, smoke_case
from specgen.verify.threaded import FRESH_WIDE_ROWS, check_calls_from_threads, fresh_pairs

QUICK = Options(examples=3, budget=1 << 13, seed=1, endurance=0)


def write_spec(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_spec(path)


@pytest.fixture
def layernorm(tmp_path):
    return write_spec(tmp_path, "layernorm", (
        "name: layernorm\n"
        "description: LayerNorm over the last dim, no affine\n"
        'signature: "layernorm(x: Tensor[N, D], eps: float = 1e-5 in [1e-6, 1e-3]) -> Tensor[N, D]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64], D: [1, 2048]}\n"
        "reference: |\n"
        "  import torch.nn.functional as F\n"
        "  def reference(x, eps=1e-5):\n"
        "      return F.layer_norm(x, x.shape[-1:], eps=eps)\n"
        "benchmark:\n"
        "  - {N: 64, D: 2048}\n"))


@pytest.fixture
def rmsnorm(tmp_path):
    return write_spec(tmp_path, "rms", (
        "name: rms\n"
        "description: RMSNorm over the last dim, no weight\n"
        'signature: "rms(x: Tensor[N, D], eps: float = 1e-6 in [1e-8, 1e-2]) -> Tensor[N, D]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64], D: [1, 2048]}\n"
        "reference: |\n"
        "  import torch\n"
        "  def reference(x, eps=1e-6):\n"
        "      return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)\n"
        "benchmark:\n"
        "  - {N: 64, D: 2048}\n"))


def _scalar(k, name, default):
    return k.scalars.get(name, default)


class ScalarKernel(fakes.PyKernel):
    """A stand-in that sees the call's scalars (PyKernel's impls see tensors and dims only)."""

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.scalars = scalars
        return super().call(direction, tensors, scalars, dims, stream)


def layernorm_two_pass(k, t, dims):
    x = t["x"].float()
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    t["out"].copy_((x - mean) * torch.rsqrt(var + _scalar(k, "eps", 1e-5)))


def layernorm_one_pass_wide(k, t, dims):
    """Rows wider than 64: var = E[x^2] - mean^2 in float32 (clamped at 0), one pass."""
    if dims["D"] <= 64:
        return layernorm_two_pass(k, t, dims)
    x = t["x"].float()
    mean = x.mean(-1, keepdim=True)
    var = (x.pow(2).mean(-1, keepdim=True) - mean * mean).clamp_min(0)
    t["out"].copy_((x - mean) * torch.rsqrt(var + _scalar(k, "eps", 1e-5)))


def rms_honest(k, t, dims):
    x = t["x"].double()
    t["out"].copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _scalar(k, "eps", 1e-6)))


def rms_overflow_safe_unguarded(k, t, dims):
    """Rows wider than 32 scaled by 1/max|x| first (overflow-safe), with no guard for max = 0: an
    all-zero row gives 0/0 (NaN) where torch gives 0."""
    rms_honest(k, t, dims)
    if dims["D"] > 32:
        dead = (t["x"] == 0).all(-1, keepdim=True)
        t["out"].copy_(torch.where(dead, torch.full_like(t["out"], float("nan")), t["out"]))


def test_offset_rows_are_uncentred_and_zero_rows_are_zero():
    from specgen.spec import parse_signature

    sig = parse_signature("f(x: Tensor[N, D]) -> Tensor[N, D]")
    x = make_inputs(sig, {"N": 12, "D": 64}, "float32", seed=3, distribution="offset")["x"].double()
    ratio = x.mean(-1).abs() / x.std(-1)
    assert bool((ratio > 10).all()) and bool((ratio < 150).all()), ratio
    z = make_inputs(sig, {"N": 7, "D": 5}, "float32", seed=3, distribution="zero-rows")["x"]
    assert bool((z[1::3] == 0).all()) and bool((z[0::3] != 0).all())


def honest_passes_and_cheat_fails_on(spec, honest, cheat, distribution: str) -> None:
    """The honest stand-in passes; the cheat is wrong-result, first met on a case of `distribution`."""
    verdict = run_verification(spec, ScalarKernel(spec, honest), QUICK, device="cpu")
    assert verdict.passed, verdict.summary()
    verdict = run_verification(spec, ScalarKernel(spec, cheat), QUICK, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.counterexample.case["distribution"] == distribution, verdict.counterexample.case


def test_a_one_pass_variance_on_wide_rows_is_rejected_on_offset_rows(layernorm):
    honest_passes_and_cheat_fails_on(layernorm, layernorm_two_pass, layernorm_one_pass_wide, "offset")


def test_an_unguarded_overflow_safe_rmsnorm_is_rejected_on_zero_rows(rmsnorm):
    honest_passes_and_cheat_fails_on(rmsnorm, rms_honest, rms_overflow_safe_unguarded, "zero-rows")


# ------------------------------------------------------------------ one-hot output gradients

def log_softmax_forward(k, t, dims):
    t["out"].copy_(torch.log_softmax(t["x"].double(), -1))


def log_softmax_backward(k, t, dims):
    g, out = t["grad_out"].double(), t["out"].double()
    t["grad_x"].copy_(g - out.exp() * g.sum(-1, keepdim=True))


def skips_zero_gradient_chunks(k, t, dims):
    """The honest backward, then 0 written for every 8-element chunk whose gradients are all zero."""
    log_softmax_backward(k, t, dims)
    g, gx = t["grad_out"], t["grad_x"]
    width = g.shape[-1]
    for start in range(0, width, 8):
        chunk = g[..., start:start + 8]
        dead = (chunk == 0).all(-1, keepdim=True)
        gx[..., start:start + 8] = torch.where(dead, torch.zeros_like(gx[..., start:start + 8]),
                                               gx[..., start:start + 8])


def test_one_hot_gradients_have_one_nonzero_element_per_row():
    gen = torch.Generator().manual_seed(4)
    g = output_gradient((6, 40), torch.float32, "one-hot", gen)
    assert (g != 0).sum(-1).tolist() == [1] * 6


def test_a_backward_that_skips_zero_gradient_chunks_is_rejected_on_one_hot_gradients():
    spec = load_spec(SPECS / "log_softmax.yaml")
    options = dataclasses.replace(QUICK, directions=("backward",))
    honest = run_verification(spec, fakes.PyKernel(spec, log_softmax_forward, log_softmax_backward), options,
                              device="cpu")
    assert honest.passed, honest.summary()
    verdict = run_verification(spec, fakes.PyKernel(spec, log_softmax_forward, skips_zero_gradient_chunks), options,
                               device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    case = verdict.counterexample.case
    assert case.get("gradients") == "one-hot", case


# ------------------------------------------------------------------ scalars at full size

def test_the_first_benchmark_shape_is_drawn_with_its_scalars_drawn_and_at_their_ends(rmsnorm):
    first = smoke_case(rmsnorm)
    first = dataclasses.replace(first, dims=(("N", 64), ("D", 2048)))
    cases = scalars_at_scale(rmsnorm, first, EVERY_CLASS, seed=9)
    eps = [dict(c.scalars)["eps"] for c in cases]
    assert len(cases) == 3 and {c.dim_map["D"] for c in cases} == {2048}
    assert eps[1] == pytest.approx(1e-8) and eps[2] == pytest.approx(1e-2) and 1e-8 <= eps[0] <= 1e-2
    assert {c.distribution for c in cases} == {"tiny"}


# ------------------------------------------------------------------ threads on shapes not met before

def test_the_fresh_pairs_are_new_shapes_one_shared_and_two_wide_rows():
    spec = load_spec(SPECS / "softmax.yaml")
    pairs = fresh_pairs(spec, seed=1, budget=1 << 20)
    same, wide = pairs
    assert same[0].dim_map == same[1].dim_map and same[0].seed != same[1].seed
    widths = [case.dim_map["D"] for case in wide]
    assert widths == list(FRESH_WIDE_ROWS) and min(widths) * 4 > 48 * 1024


class FirstCallsRecorded(fakes.PyKernel):
    """Honest gelu that records, for each shape, whether its first call came from the main thread."""

    def __init__(self, spec):
        super().__init__(spec, fakes.gelu_forward)
        self.first_from_main = {}

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        key = tuple(sorted(dims.items()))
        self.first_from_main.setdefault(key, threading.current_thread() is threading.main_thread())
        return super().call(direction, tensors, scalars, dims, stream)


def test_fresh_pairs_are_called_from_the_threads_before_any_call_alone():
    spec = load_spec(SPECS / "gelu_tanh.yaml")
    kernel = FirstCallsRecorded(spec)
    runner = LocalRunner(spec, kernel, "cpu")
    same = fresh_pairs(spec, seed=1, budget=1 << 14)[0]
    cases = [prepare(spec, case, "forward", "cpu") for case in same]
    check_calls_from_threads(runner, cases, deterministic=spec.deterministic, repeat=4, fresh=True)
    assert kernel.first_from_main == {tuple(sorted(same[0].dim_map.items())): False}


# ------------------------------------------------------------------ the calling thread's scheduling state

def pins_the_calling_thread(k, t, dims):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    return fakes.gelu_forward(k, t, dims)


def test_a_call_that_leaves_its_thread_pinned_to_one_cpu_is_rejected():
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a thread that may run on two CPUs")
    spec = load_spec(SPECS / "gelu_tanh.yaml")
    before = os.sched_getaffinity(0)
    verdict = run_verification(spec, fakes.PyKernel(spec, pins_the_calling_thread),
                               dataclasses.replace(QUICK, directions=("forward",)), device="cpu")
    assert verdict.reason == "host-state-changed", verdict.summary()
    assert "cpus" in verdict.detail
    assert os.sched_getaffinity(0) == before  # put back


# ------------------------------------------------------------------ indices outside their range

def ce_forward_safe(k, t, dims):
    """Cross-entropy with its saved row statistics; an index outside [0, C) read as class 0."""
    x, target = t["logits"].float(), t["target"]
    valid = (target >= 0) & (target < x.shape[-1])
    logp = torch.log_softmax(x, -1).gather(1, target.clamp(0, x.shape[-1] - 1)[:, None])[:, 0]
    t["out"].copy_(-(logp * valid).sum() / x.shape[0])
    top = x.amax(-1)
    t["saved_max"].copy_(top)
    t["saved_logsum"].copy_(torch.exp(x - top[:, None]).sum(-1).log())


def ce_backward_safe(k, t, dims):
    x, target = t["logits"].float(), t["target"]
    c = x.shape[-1]
    valid = ((target >= 0) & (target < c)).float()[:, None]
    onehot = F.one_hot(target.clamp(0, c - 1), c).float() * valid
    p = torch.softmax(x, -1)
    t["grad_logits"].copy_((t["grad_out"].float() * (p - onehot) / x.shape[0]).to(t["grad_logits"].dtype))


def ce_backward_unchecked_write(k, t, dims):
    """The softmax part for every element, then the target's -1/N written at row * C + target with
    no range check (through the storage: a target of -100 lands before the row)."""
    x, target = t["logits"].float(), t["target"]
    grad = t["grad_logits"]
    n, c = x.shape
    g = t["grad_out"].float()
    grad.copy_((g * torch.softmax(x, -1) / n).to(grad.dtype))
    for row in range(n):
        cell = torch.as_strided(grad, (1,), (1,), grad.storage_offset() + row * c + int(target[row]))
        cell.sub_((g / n).to(grad.dtype))


def test_out_of_range_values_are_the_padding_label_and_the_ranges_end():
    spec = load_spec(SPECS / "cross_entropy.yaml")
    assert ranged_inputs(spec, {"N": 5, "C": 9}) == {"target": (0, 9)}
    assert out_of_range_values(0, 9) == (-100, 9)
    assert out_of_range_values(-200, 9) == (-201, 9)


def test_a_write_at_an_unchecked_target_index_is_out_of_bounds():
    spec = load_spec(SPECS / "cross_entropy.yaml")
    options = dataclasses.replace(QUICK, directions=("forward", "backward"))
    honest = run_verification(spec, fakes.PyKernel(spec, ce_forward_safe, ce_backward_safe), options, device="cpu")
    assert honest.passed, honest.summary()
    verdict = run_verification(spec, fakes.PyKernel(spec, ce_forward_safe, ce_backward_unchecked_write), options,
                               device="cpu")
    assert verdict.reason == "out-of-bounds", verdict.summary()
    assert "outside their declared range" in verdict.detail


# ------------------------------------------------------------------ memory left allocated

def test_a_leak_is_reported_with_its_bytes_and_the_calls_that_left_it():
    from specgen.verify.isolation import leaked_memory_failure
    from specgen.verify.verdict import LEAKED_MEMORY, REASONS

    spec = load_spec(SPECS / "softmax.yaml")
    failure = leaked_memory_failure(spec, {"direction": "forward"}, {"bytes": 4096, "op": "timed"})
    assert failure.reason == LEAKED_MEMORY and LEAKED_MEMORY in REASONS
    assert "4096 bytes" in failure.detail and "softmax_forward" in failure.detail and "timed calls" in failure.detail


def test_the_pool_is_not_read_where_there_is_no_gpu():
    from specgen.verify.candidate_main import LEAK_CHECKED, pool_in_use

    if torch.cuda.is_available():
        pytest.skip("reads the device's pool on a GPU")
    assert pool_in_use(torch, 0) is None
    assert "capture" not in LEAK_CHECKED and "replay" not in LEAK_CHECKED and "timed" in LEAK_CHECKED


def test_a_thread_left_pinned_is_reported_and_put_back():
    from specgen.verify.candidate_main import thread_report, thread_state

    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a thread that may run on two CPUs")
    before = thread_state()
    assert thread_report(before) is None
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    report = thread_report(before)
    assert report is not None and report["after"]["cpus"] != report["before"]["cpus"]
    assert thread_state() == before


# ------------------------------------------------------------------ no GPU memory left to allocate

def gelu_with_checked_scratch(k, t, dims):
    """Takes scratch first (cudaMallocAsync on a GPU) and returns its error when it fails."""
    if getattr(k, "allocations_fail", False):
        return 2  # cudaErrorMemoryAllocation, before launching anything
    return fakes.gelu_forward(k, t, dims)


def gelu_with_unchecked_scratch(k, t, dims):
    """Launches with the null pointer it got: an illegal address, the context lost."""
    if getattr(k, "allocations_fail", False):
        return 700  # cudaErrorIllegalAddress
    return fakes.gelu_forward(k, t, dims)


def gelu_skipping_work_without_scratch(k, t, dims):
    """Sees the failure and returns success without writing its outputs."""
    if getattr(k, "allocations_fail", False):
        return 0
    return fakes.gelu_forward(k, t, dims)


@pytest.mark.parametrize("impl, reason", [(gelu_with_checked_scratch, "passed"),
                                          (fakes.gelu_forward, "passed"),
                                          (gelu_with_unchecked_scratch, "crash"),
                                          (gelu_skipping_work_without_scratch, "wrong-result")])
def test_a_call_with_no_memory_left_may_fail_cleanly_but_not_crash_or_lie(impl, reason):
    spec = load_spec(SPECS / "gelu_tanh.yaml")
    verdict = run_verification(spec, fakes.PyKernel(spec, impl), dataclasses.replace(QUICK, directions=("forward",)),
                               device="cpu")
    assert verdict.reason == reason, verdict.summary()
    if reason != "passed":
        assert "no GPU memory left to allocate" in verdict.detail
