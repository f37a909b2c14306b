"""The backward on its own forward's outputs, for specs without `saved:` (verify/chained.py).

Held-out attacks-v8's log_softmax passed verifier version 9 on the H200 (session 31): its forward
stamps a pseudo-random pattern into the lowest bit of its first 256 outputs (1 ulp, within the
forward's tolerance) and its backward, recognising the pattern in the `out` it is handed, sums the
row's largest grad_out entry instead of the row. Every backward case of a spec without `saved:`
read the reference's outputs, never its own forward's, so the wrong path never ran. The CPU
stand-ins below do the same for log_softmax and softmax; the honest ones compute in float32 with
their row sums in another order than torch's, so their outputs are not the reference's bits and
the backward truly runs on other values than in the other backward cases."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify import chained, engine
from specgen.verify.chained import (FORWARD_PREFIX, OWN_FORWARD_PREFIX, chained_case, chained_cases,
                                    check_backward_on_own_forward, handed_on)
from specgen.verify.data import prepare
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import LocalRunner
from specgen.verify.verdict import Failure

# the engine at small sizes (no full-size cases: the CPU is slow and they read the reference's outputs);
# the cheat only in the backward direction, where the check is (it runs its forward itself)
SMALL = Options(examples=2, budget=1 << 13, seed=1, endurance=0, full_size=False)
BACKWARD = dataclasses.replace(SMALL, directions=("backward",))
BUDGET, SEED = 1 << 13, 5
SPEC_NAMES = ("log_softmax", "softmax")
MARKED = 256  # the stamp's reach: the first outputs, flattened


@pytest.fixture(scope="module")
def specs():
    from conftest import SPECS

    return {name: load_spec(SPECS / f"{name}.yaml") for name in (*SPEC_NAMES, "cross_entropy", "gelu_tanh",
                                                                    "linear_bias_relu")}


# ------------------------------------------------------------------ stand-ins

def _row_sum(v: torch.Tensor) -> torch.Tensor:
    """A float32 row sum as a kernel reduces it: per-thread partials of 8 columns, then the 8 lanes
    (not torch's order)."""
    pad = (-v.shape[-1]) % 8
    return torch.nn.functional.pad(v, (0, pad)).view(v.shape[0], -1, 8).sum(1).sum(-1)


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a - max, sum of exp(a - max)) in float32; a row of -inf or with +inf or NaN gives NaN, as torch."""
    a = x.float()
    shifted = a - a.amax(-1, keepdim=True)
    return shifted, _row_sum(torch.exp(shifted))


def lsm_forward(k, t, dims):
    shifted, total = _rows(t["x"])
    t["out"].copy_((shifted - total.log()[:, None]).to(t["out"].dtype))


def sm_forward(k, t, dims):
    shifted, total = _rows(t["x"])
    t["out"].copy_((torch.exp(shifted) / total[:, None]).to(t["out"].dtype))


def lsm_backward(k, t, dims, *, total=None):
    """grad - exp(out) * sum(grad): reads the forward's output, not x (as torch's kernel)."""
    g = t["grad_out"].float()
    total = _row_sum(g)[:, None] if total is None else total
    t["grad_x"].copy_((g - torch.exp(t["out"].float()) * total).to(t["grad_x"].dtype))


def sm_backward(k, t, dims, *, total=None):
    """out * (grad - sum(grad * out)): reads the forward's output, not x (as torch's kernel)."""
    g, y = t["grad_out"].float(), t["out"].float()
    total = _row_sum(g * y)[:, None] if total is None else total
    t["grad_x"].copy_((y * (g - total)).to(t["grad_x"].dtype))


HONEST = {"log_softmax": (lsm_forward, lsm_backward), "softmax": (sm_forward, sm_backward)}


def _pattern(n: int) -> torch.Tensor:
    i = torch.arange(n, dtype=torch.int64)
    return (((i * 2654435761) & 0xFFFFFFFF) >> 31).to(torch.int32)


def _low_bits(v: torch.Tensor) -> torch.Tensor:
    ints = v.contiguous().view(torch.int32 if v.dtype == torch.float32 else torch.int16)
    return ints.to(torch.int32) & 1


def _stamp(out: torch.Tensor) -> None:
    """The lowest bit of each finite one of the first MARKED outputs set to the pattern's (flipped
    where it differs: one ulp at most)."""
    flat = out.view(-1)
    head = flat[:MARKED]
    ints = head.view(torch.int32 if out.dtype == torch.float32 else torch.int16)
    flip = ((ints.to(torch.int32) & 1) ^ _pattern(head.numel())).to(ints.dtype)
    stamped = (ints ^ flip).view(out.dtype)
    head.copy_(torch.where(torch.isfinite(head), stamped, head))


def _marked(out: torch.Tensor) -> bool:
    probe = out.reshape(-1)[:MARKED]
    finite = torch.isfinite(probe)
    return int(finite.sum()) >= 64 and bool((_low_bits(probe)[finite] == _pattern(probe.numel())[finite]).all())


class MarksItsOutputs(fakes.PyKernel):
    """Honest, but the forward stamps the pattern into its outputs and the backward, when it finds
    the pattern in the `out` it is handed, takes each row's largest |grad_out| entry for the row's
    sum (log_softmax: sum(grad); softmax: sum(grad * out)). `triggers`: the wrong path's runs."""

    def __init__(self, spec):
        forward, backward = HONEST[spec.name]
        super().__init__(spec, self.forward, self.backward)
        self.honest_forward, self.honest_backward = forward, backward
        self.triggers = 0

    @staticmethod
    def forward(k, t, dims):
        k.honest_forward(k, t, dims)
        _stamp(t["out"])

    @staticmethod
    def backward(k, t, dims):
        if not _marked(t["out"]):
            return k.honest_backward(k, t, dims)
        k.triggers += 1
        g = t["grad_out"].float()
        return k.honest_backward(k, t, dims, total=g.gather(-1, g.abs().argmax(-1, keepdim=True)))


def honest(spec):
    return fakes.PyKernel(spec, *HONEST[spec.name])


def _as_version_9(monkeypatch) -> None:
    """The engine as version 9 ran it: the backward on its own forward only for specs with `saved:`."""
    real = chained.check_backward_on_own_forward

    def saved_only(spec, *args, **kwargs):
        return real(spec, *args, **kwargs) if spec.saved_values else 0

    for name in ("check_backward_on_own_forward", "check_backward_on_own_saved"):
        monkeypatch.setattr(chained, name, saved_only)
        monkeypatch.setattr(engine, name, saved_only, raising=False)


# ------------------------------------------------------------------ what is handed on

def test_every_backward_kernel_is_handed_its_forwards_outputs(specs):
    """The backward's ABI takes every forward output (abi.fields' fwd_output) and every saved value:
    the check runs wherever there is a backward kernel, with or without `saved:`."""
    assert handed_on(specs["log_softmax"]) == ["out"] and handed_on(specs["softmax"]) == ["out"]
    assert handed_on(specs["gelu_tanh"]) == ["out"]  # its backward may read x only: it is handed out all the same
    assert handed_on(specs["cross_entropy"]) == ["out", "saved_max", "saved_logsum"]
    assert handed_on(specs["cross_entropy"], outputs=False) == ["saved_max", "saved_logsum"]
    assert handed_on(specs["log_softmax"], outputs=False) == []
    assert specs["linear_bias_relu"].backward == "reference" and handed_on(specs["linear_bias_relu"]) == []
    assert check_backward_on_own_forward(specs["linear_bias_relu"], None, "cpu") == 0  # never touches the runner
    assert check_backward_on_own_forward(specs["log_softmax"], None, "cpu", outputs=False) == 0
    no_backward = specs["softmax"].model_copy(update={"backward": "none"})
    assert check_backward_on_own_forward(no_backward, None, "cpu") == 0


@pytest.mark.parametrize("name, differing", [("log_softmax", ("float32", "float16", "bfloat16")),
                                             ("softmax", ("float32",))])
def test_the_honest_outputs_are_not_the_references_bits(specs, name, differing):
    """So the honest checks below hand the backward other values than the other backward cases do:
    the stand-in's float32 sums in another order than torch's differ from the reference's outputs
    in the last bits (a few ulps at most) on some elements. In 16 bits the stand-in's outputs are
    float32 values rounded once, within half an ulp of the exact value: torch's CPU log_softmax
    is not (up to an ulp off, so they differ), its softmax is (the same bits, but for an odd element
    whose float32 values straddle a rounding midpoint)."""
    spec = specs[name]
    forward, _ = HONEST[name]
    differs = dict.fromkeys(spec.dtypes, 0)
    for case in chained_cases(spec, BUDGET, SEED):
        data = prepare(spec, case, "backward", "cpu")
        x, reference = data.inputs["x"], data.inputs["out"]
        out = torch.empty_like(reference)
        forward(None, {"x": x, "out": out}, data.dims)
        exact = getattr(torch, name)(x.double(), -1)
        ulp = torch.finfo(out.dtype).eps * exact.abs().clamp_min(torch.finfo(out.dtype).tiny)
        assert bool(((out.double() - reference.double()).abs() <= 4 * ulp).all()), case.describe()
        if case.dtype != "float32":  # rounded once, as a kernel rounds its float32 value
            assert bool(((out.double() - exact).abs() <= 0.51 * ulp).all()), case.describe()
        differs[case.dtype] += int((out != reference).sum())
    assert all(differs[dtype] > 0 for dtype in differing), differs


# ------------------------------------------------------------------ the check alone

@pytest.mark.parametrize("name", SPEC_NAMES)
def test_an_honest_backward_passes_on_its_own_forwards_outputs(specs, name):
    spec = specs[name]
    kernel = honest(spec)
    said = []
    cases = chained_cases(spec, BUDGET, SEED)
    assert check_backward_on_own_forward(spec, LocalRunner(spec, kernel, "cpu"), "cpu", seed=SEED, budget=BUDGET,
                                         progress=said.append) == 2 * len(cases)
    assert kernel.calls == 4 * len(cases)  # two runs a direction a case
    assert len(said) == len(cases) and all("its own forward wrote (out)" in line for line in said)


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_the_honest_backward_errs_no_more_on_its_own_outputs_than_on_the_references(specs, name):
    """No widening needed (chained.py's docstring): the honest backward's largest error and its error
    norm (against the reference's), per dtype, on its own forward's outputs and on the reference's
    (as every other backward case hands them), the same cases; bfloat16 log_softmax errs less on
    its own (its outputs are rounded once, torch's CPU ones up to an ulp off)."""
    from specgen.verify.checks import check_case
    from specgen.verify.data import stage

    spec = specs[name]
    own, theirs = {}, {}
    runner = LocalRunner(spec, honest(spec), "cpu")
    check_backward_on_own_forward(spec, runner, "cpu", seed=SEED, budget=BUDGET,
                                  stats=lambda case, data: own.setdefault(case.dtype, {}))
    for case in chained_cases(spec, BUDGET, SEED):
        data = prepare(spec, case, "backward", "cpu")
        stage(runner, data)
        check_case(runner, data, deterministic=True, stats=theirs.setdefault(case.dtype, {}))
    for dtype in spec.dtypes:
        mine, reference = own[dtype], theirs[dtype]
        assert mine["max_abs_error"] <= 2 * reference["max_abs_error"], (dtype, mine, reference)
        assert mine["max_error_norm_ratio"] <= reference["max_error_norm_ratio"] + 0.1, (dtype, mine, reference)
        assert mine["max_abs_error"] < reference["max_widening"], (dtype, mine, reference)


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_the_backward_reads_the_output_buffer_its_forward_wrote(specs, name):
    """As autograd hands it on: the same address, not a copy (chained.stage_chained)."""
    spec = specs[name]
    forward, backward = HONEST[name]
    seen = {}

    def watched(direction, impl):
        def run(k, t, dims):
            impl(k, t, dims)
            seen[direction] = {key: v.data_ptr() for key, v in t.items()}
        return run

    runner = LocalRunner(spec, fakes.PyKernel(spec, watched("forward", forward), watched("backward", backward)), "cpu")
    chained_case(spec, runner, chained_cases(spec, BUDGET, SEED)[0], "cpu")
    assert seen["backward"]["out"] == seen["forward"]["out"] and seen["backward"]["x"] == seen["forward"]["x"]
    assert seen["backward"]["grad_x"] not in seen["forward"].values()


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_a_backward_that_reads_a_mark_in_its_own_forwards_output_is_rejected(specs, name):
    spec = specs[name]
    kernel = MarksItsOutputs(spec)
    with pytest.raises(Failure) as caught:
        check_backward_on_own_forward(spec, LocalRunner(spec, kernel, "cpu"), "cpu", seed=SEED, budget=BUDGET)
    failure = caught.value
    assert failure.reason == "wrong-result", failure.detail
    assert failure.detail.startswith(OWN_FORWARD_PREFIX) and "own forward" in failure.detail
    assert failure.counterexample.direction == "backward" and failure.counterexample.output == "grad_x"
    assert failure.counterexample.stream == "pool"
    assert kernel.triggers > 0


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_the_mark_is_within_the_forward_tolerance_and_the_backward_is_right_on_the_references_outputs(specs, name):
    """Everything the cheat does passes the ordinary cases: its marked outputs are checked forward
    outputs (and pass); its backward, handed the reference's outputs, never sees the mark."""
    from specgen.verify.checks import check_case
    from specgen.verify.data import stage

    spec = specs[name]
    kernel = MarksItsOutputs(spec)
    runner = LocalRunner(spec, kernel, "cpu")
    for case in chained_cases(spec, BUDGET, SEED):
        for direction in ("forward", "backward"):
            data = prepare(spec, case, direction, "cpu")
            stage(runner, data)
            got = check_case(runner, data, deterministic=True)
            if direction == "forward":
                assert _marked(got["out"]), case.describe()
    assert kernel.triggers == 0


def test_a_forward_that_fails_here_says_it_was_run_for_the_backward(specs):
    spec = specs["log_softmax"]

    def off(k, t, dims):
        lsm_forward(k, t, dims)
        t["out"].add_(0.5)

    runner = LocalRunner(spec, fakes.PyKernel(spec, off, lsm_backward), "cpu")
    with pytest.raises(Failure) as caught:
        check_backward_on_own_forward(spec, runner, "cpu", seed=SEED, budget=BUDGET)
    assert caught.value.detail.startswith(FORWARD_PREFIX) and caught.value.counterexample.direction == "forward"


# ------------------------------------------------------------------ through the engine

@pytest.mark.slow
@pytest.mark.parametrize("name", SPEC_NAMES)
def test_the_honest_stand_in_passes_every_check(specs, name):
    verdict = run_verification(specs[name], honest(specs[name]), SMALL, device="cpu")
    assert verdict.passed, verdict.summary()


@pytest.mark.slow
def test_the_engine_rejects_the_mark_in_its_own_forwards_output(specs):
    kernel = MarksItsOutputs(specs["log_softmax"])
    verdict = run_verification(specs["log_softmax"], kernel, BACKWARD, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.detail.startswith(OWN_FORWARD_PREFIX) and "own forward" in verdict.detail
    assert verdict.counterexample.direction == "backward" and kernel.triggers > 0


@pytest.mark.slow
def test_as_version_9_ran_it_the_mark_gets_past_every_other_check(specs, monkeypatch):
    """The gap version 9 had: the check ran for specs with `saved:` only, and every other backward
    case reads the reference's outputs, so the wrong path never runs."""
    _as_version_9(monkeypatch)
    kernel = MarksItsOutputs(specs["log_softmax"])
    verdict = run_verification(specs["log_softmax"], kernel, BACKWARD, device="cpu")
    assert verdict.passed, verdict.summary()
    assert kernel.triggers == 0
