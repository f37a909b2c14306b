"""The backward on the saved values the candidate's own forward wrote (verify/chained.py, verifier
version 8). A held-out red-team cross-entropy passed version 7 on the GPU: its forward stamps a
mark into the low bits of saved_max (bits a 16-bit row's max upcast to float32 leaves zero; one
float32 ulp is far within tolerance) and its backward, seeing the mark, ignores grad_out (right
only when it is 1). Every backward case read the definitions' saved values, never the mark. The
CPU stand-ins below do the same; the honest one's forward sums its logsum in another order than
torch, as a kernel does, so its saved values are not the definition's bits."""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify import chained, engine
from specgen.verify.chained import (CHAINED_STREAM, FORWARD_PREFIX, OWN_SAVED_PREFIX, chained_cases,
                                    check_backward_on_own_saved)
from specgen.verify.data import LOSS_SCALE, prepare
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import LocalRunner
from specgen.verify.verdict import Failure

SMALL = Options(examples=4, budget=1 << 13, seed=1, endurance=0)
SIXTEEN_BIT = (torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def cross_entropy():
    from conftest import SPECS

    return load_spec(SPECS / "cross_entropy.yaml")


# ------------------------------------------------------------------ stand-ins

def _row_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, logsum) in float32 as a kernel computes them: the max exactly, the sum of exp in
    per-thread partials of 8 columns reduced after (not torch's order)."""
    a = x.float()
    top = a.amax(-1)
    e = torch.exp(a - top[:, None])
    width = e.shape[-1]
    pad = (-width) % 8
    parts = F.pad(e, (0, pad)).view(e.shape[0], -1, 8).sum(1)  # float32 partials, then the 8 lanes
    return top, parts.sum(-1).log()


def ce_forward(k, t, dims):
    # a target outside [0, C) (the verifier's padding-label call) read at the row's edge, as a kernel must
    x, target = t["logits"], t["target"].clamp(0, t["logits"].shape[-1] - 1)
    t["out"].copy_(F.cross_entropy(x.float(), target))
    top, logsum = _row_stats(x)
    t["saved_max"].copy_(top)
    t["saved_logsum"].copy_(logsum)


def ce_backward(k, t, dims, *, grad_out=None):
    """(logits - max) - logsum read from the saved values, times grad_out / N: no row reduction."""
    x, target = t["logits"].float(), t["target"].clamp(0, t["logits"].shape[-1] - 1)
    top, logsum = t["saved_max"].float(), t["saved_logsum"].float()
    p = torch.exp((x - top[:, None]) - logsum[:, None])
    onehot = F.one_hot(target, x.shape[-1]).float()
    g = t["grad_out"].float() if grad_out is None else torch.tensor(grad_out)
    t["grad_logits"].copy_((g * (p - onehot) / x.shape[0]).to(t["grad_logits"].dtype))


def _mark_bits(saved_max: torch.Tensor) -> torch.Tensor:
    return saved_max.view(torch.int32) & 1


def marks_saved_max(k, t, dims):
    """Honest, then the lowest bit of every finite saved_max set for 16-bit logits: one float32
    ulp (1e-7 relative), where the definition's max (a 16-bit value upcast) has 13+ zero bits."""
    ce_forward(k, t, dims)
    if t["logits"].dtype in SIXTEEN_BIT:
        m = t["saved_max"]
        marked = (m.view(torch.int32) | 1).view(torch.float32)
        m.copy_(torch.where(torch.isfinite(m), marked, m))


def ignores_grad_out_when_marked(k, t, dims):
    """Honest on the definitions' saved values; where its own forward's mark is on every finite
    row max, grad_out taken as 1 (a path for a loss that is never scaled nor accumulated)."""
    m = t["saved_max"]
    finite = torch.isfinite(m)
    if t["logits"].dtype in SIXTEEN_BIT and bool(finite.any()) and bool((_mark_bits(m)[finite] == 1).all()):
        return ce_backward(k, t, dims, grad_out=1.0)
    return ce_backward(k, t, dims)


class PointerKeyed(fakes.PyKernel):
    """No mark at all: the forward remembers where it wrote saved_max, and the backward ignores
    grad_out when it reads saved_max from there (autograd hands the backward the very buffer)."""

    def __init__(self, spec):
        super().__init__(spec, self.forward, self.backward)
        self.written_at = None

    @staticmethod
    def forward(k, t, dims):
        ce_forward(k, t, dims)
        k.written_at = t["saved_max"].data_ptr()

    @staticmethod
    def backward(k, t, dims):
        return ce_backward(k, t, dims, grad_out=1.0 if t["saved_max"].data_ptr() == k.written_at else None)


def marks_the_loss(k, t, dims):
    """Honest saved values; the float32 loss's lowest 4 bits set to 0b1011 (within 1e-5 relative)."""
    ce_forward(k, t, dims)
    out = t["out"]
    out.copy_(((out.view(torch.int32) & ~0xF) | 0xB).view(torch.float32))


def ignores_grad_out_when_the_loss_is_marked(k, t, dims):
    loss_marked = int(t["out"].view(torch.int32)) & 0xF == 0xB
    return ce_backward(k, t, dims, grad_out=1.0 if loss_marked else None)


def honest(spec):
    return fakes.PyKernel(spec, ce_forward, ce_backward)


def cheat(spec):
    return fakes.PyKernel(spec, marks_saved_max, ignores_grad_out_when_marked)


def _without_the_check(monkeypatch) -> None:
    """The engine as version 7 ran it: the chained check a no-op wherever it is reached from."""
    def nothing(*args, **kwargs):
        return 0

    monkeypatch.setattr(chained, "check_backward_on_own_saved", nothing)
    monkeypatch.setattr(engine, "check_backward_on_own_saved", nothing, raising=False)


# ------------------------------------------------------------------ the cases

def test_the_cases_are_cheap_in_every_dtype_with_gradients_that_are_not_one(cross_entropy):
    cases = chained_cases(cross_entropy, 1 << 20, seed=3)
    assert {c.dtype for c in cases} == set(cross_entropy.dtypes)
    assert {c.gradients for c in cases} == {"large", ""} and {c.distribution for c in cases} == {"normal"}
    shapes = {c.dims for c in cases}
    assert len(shapes) == 2 and len(cases) == 2 * 2 * len(cross_entropy.dtypes)
    assert {"N": 37, "C": 37} in [dict(s) for s in shapes]
    aligned = next(dict(s) for s in shapes if dict(s) != {"N": 37, "C": 37})
    assert all(v % 16 == 0 for v in aligned.values())
    assert all(c.seed != d.seed for c, d in zip(cases, cases[1:]))
    assert CHAINED_STREAM == "pool"
    for case in cases[:2]:  # loss-scaled, then N(0, 1): never 1
        data = prepare(cross_entropy, case, "backward", "cpu")
        g = float(data.inputs["grad_out"])
        assert data.scale == (LOSS_SCALE if case.gradients == "large" else 1.0)
        assert abs(g - 1.0) > 1e-3 and abs(g) > 0


def test_nothing_runs_for_a_spec_without_a_backward_kernel():
    from conftest import SPECS

    # since version 10 every backward kernel meets its own forward's outputs (test_verify_own_forward_outputs.py)
    linear = load_spec(SPECS / "linear_bias_relu.yaml")
    assert linear.backward != "kernel"
    assert check_backward_on_own_saved(linear, None, "cpu") == 0  # never touches the runner


# ------------------------------------------------------------------ the check alone

def test_an_honest_forward_and_backward_pass_on_its_own_saved_values(cross_entropy):
    kernel = honest(cross_entropy)
    runner = LocalRunner(cross_entropy, kernel, "cpu")
    said = []
    assert check_backward_on_own_saved(cross_entropy, runner, "cpu", seed=5, budget=1 << 16,
                                       progress=said.append) == 2 * len(chained_cases(cross_entropy, 1 << 16, 5))
    assert kernel.calls == 4 * len(chained_cases(cross_entropy, 1 << 16, 5))  # two runs a direction a case
    assert all("its own forward wrote" in line for line in said)


def test_the_honest_saved_values_are_not_the_definitions_bits(cross_entropy):
    """So the check above ran the backward on other values than the definitions': its logsum, a
    float32 sum in another order, differs from torch's in the last bits; no widening needed
    (the backward's truth never reads a saved value, and a few float32 ulps of a logsum in
    [0, log C] move p by 1e-6 relative at most)."""
    from specgen.saved import evaluate_saved

    differs = 0
    for case in chained_cases(cross_entropy, 1 << 16, seed=5):
        data = prepare(cross_entropy, case, "backward", "cpu")
        top, logsum = _row_stats(data.inputs["logits"])
        defined = evaluate_saved(cross_entropy, {"logits": data.inputs["logits"], "target": data.inputs["target"]},
                                 case.dtype)
        assert torch.equal(top, defined["saved_max"])
        assert (logsum.double() - defined["saved_logsum"].double()).abs().max() < 1e-5
        differs += int((logsum != defined["saved_logsum"]).sum())
    assert differs > 0


def test_a_backward_that_reads_a_mark_its_own_forward_left_is_rejected(cross_entropy):
    runner = LocalRunner(cross_entropy, cheat(cross_entropy), "cpu")
    with pytest.raises(Failure) as caught:
        check_backward_on_own_saved(cross_entropy, runner, "cpu", seed=5, budget=1 << 16)
    failure = caught.value
    assert failure.reason == "wrong-result", failure.detail
    assert failure.detail.startswith(OWN_SAVED_PREFIX)
    assert failure.counterexample.direction == "backward" and failure.counterexample.output == "grad_logits"
    assert failure.counterexample.case["dtype"] in ("float16", "bfloat16")
    assert failure.counterexample.stream == "pool"


def test_the_mark_is_within_the_forward_tolerance_and_the_backward_is_right_on_the_definitions(cross_entropy):
    """Everything the cheat does passes the ordinary cases: the marked forward's saved values are
    checked outputs (and pass), the backward on the definitions' values is honest."""
    from specgen.verify.checks import check_case
    from specgen.verify.data import stage

    kernel = cheat(cross_entropy)
    runner = LocalRunner(cross_entropy, kernel, "cpu")
    for case in chained_cases(cross_entropy, 1 << 16, seed=5):
        for direction in ("forward", "backward"):
            data = prepare(cross_entropy, case, direction, "cpu")
            stage(runner, data)
            out = check_case(runner, data, deterministic=True)
            if direction == "forward" and case.dtype != "float32":
                assert bool((_mark_bits(out["saved_max"]) == 1).all())


def test_the_backward_reads_the_buffers_its_forward_read_and_wrote(cross_entropy):
    """As autograd hands them on: the same addresses, not copies (chained.stage_chained)."""
    seen = {}

    def forward(k, t, dims):
        ce_forward(k, t, dims)
        seen["forward"] = {name: v.data_ptr() for name, v in t.items()}

    def backward(k, t, dims):
        ce_backward(k, t, dims)
        seen["backward"] = {name: v.data_ptr() for name, v in t.items()}

    runner = LocalRunner(cross_entropy, fakes.PyKernel(cross_entropy, forward, backward), "cpu")
    chained.chained_case(cross_entropy, runner, chained_cases(cross_entropy, 1 << 16, 5)[0], "cpu")
    fwd, bwd = seen["forward"], seen["backward"]
    for name in ("logits", "target", "out", "saved_max", "saved_logsum"):
        assert bwd[name] == fwd[name], name
    assert bwd["grad_logits"] not in fwd.values() and bwd["grad_out"] not in fwd.values()
    chained.chained_case(cross_entropy, runner, chained_cases(cross_entropy, 1 << 16, 5)[0], "cpu", outputs=False)
    assert seen["backward"]["saved_max"] == seen["forward"]["saved_max"]
    assert seen["backward"]["out"] != seen["forward"]["out"]  # the reference's loss, placed as an input


def test_a_backward_keyed_on_where_its_forward_wrote_is_rejected(cross_entropy):
    runner = LocalRunner(cross_entropy, PointerKeyed(cross_entropy), "cpu")
    with pytest.raises(Failure) as caught:
        check_backward_on_own_saved(cross_entropy, runner, "cpu", seed=5, budget=1 << 16)
    assert caught.value.reason == "wrong-result" and caught.value.detail.startswith(OWN_SAVED_PREFIX)


def test_a_mark_in_the_forward_output_is_met_where_the_backward_reads_the_forward_output(cross_entropy):
    """The loss is a float32 held to 1e-5: its low bits are free for a mark in every dtype."""
    kernel = fakes.PyKernel(cross_entropy, marks_the_loss, ignores_grad_out_when_the_loss_is_marked)
    runner = LocalRunner(cross_entropy, kernel, "cpu")
    with pytest.raises(Failure) as caught:
        check_backward_on_own_saved(cross_entropy, runner, "cpu", seed=5, budget=1 << 16)
    assert caught.value.reason == "wrong-result" and caught.value.detail.startswith(OWN_SAVED_PREFIX)
    assert check_backward_on_own_saved(cross_entropy, runner, "cpu", seed=5, budget=1 << 16, outputs=False) > 0


def test_a_forward_that_fails_here_says_it_was_run_for_the_backward(cross_entropy):
    def wrong_logsum(k, t, dims):
        ce_forward(k, t, dims)
        t["saved_logsum"].add_(0.5)

    runner = LocalRunner(cross_entropy, fakes.PyKernel(cross_entropy, wrong_logsum, ce_backward), "cpu")
    with pytest.raises(Failure) as caught:
        check_backward_on_own_saved(cross_entropy, runner, "cpu", seed=5, budget=1 << 16)
    assert caught.value.detail.startswith(FORWARD_PREFIX) and "saved_logsum" in caught.value.detail
    assert caught.value.counterexample.direction == "forward"


# ------------------------------------------------------------------ through the engine

@pytest.mark.slow
def test_the_honest_stand_in_passes_every_check(cross_entropy):
    verdict = run_verification(cross_entropy, honest(cross_entropy), SMALL, device="cpu")
    assert verdict.passed, verdict.summary()


@pytest.mark.slow
def test_without_the_check_the_mark_gets_past_every_other_check(cross_entropy, monkeypatch):
    """The gap version 7 had: every backward case reads the definitions' saved values."""
    _without_the_check(monkeypatch)
    verdict = run_verification(cross_entropy, cheat(cross_entropy), SMALL, device="cpu")
    assert verdict.passed, verdict.summary()


@pytest.mark.slow
def test_the_engine_rejects_the_mark_on_its_own_saved_values(cross_entropy):
    verdict = run_verification(cross_entropy, cheat(cross_entropy), SMALL, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.detail.startswith(OWN_SAVED_PREFIX)
    assert verdict.counterexample.direction == "backward"
