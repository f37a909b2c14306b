"""Two calls at the same time on two streams (checks.check_calls_side_by_side): scratch kept
outside the workspace the ABI hands each call is shared by concurrent calls. And a copy of the
outputs queued on the call's stream right after it (checks.check_finished_on_its_stream): work
left on another stream is not finished there. On the CPU the
stand-in runner takes each call's launches in turns, as a GPU interleaves two streams' kernels;
tests/adversarial/static_scratch_across_calls.cu is the same cheat on the GPU."""
from __future__ import annotations

import pytest

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify.engine import Options, run_verification

SMALL = Options(examples=4, budget=1 << 13, seed=1)


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


def test_scratch_shared_between_calls_is_caught_only_side_by_side(gelu, monkeypatch):
    # since verifier version 8 the first calls of a direction are two at once on two streams: they
    # meet it before anything else; without that check, the calls side by side do
    verdict = run_verification(gelu, fakes.StaticScratchKernel(gelu), SMALL, device="cpu")
    assert verdict.reason == "wrong-result" and "the process's first calls" in verdict.detail, verdict.summary()
    from specgen.verify import engine

    monkeypatch.setattr(engine, "check_first_calls", lambda *a, **k: None)
    kernel = fakes.StaticScratchKernel(gelu)
    verdict = run_verification(gelu, kernel, SMALL, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert "at the same time on another stream" in verdict.detail
    assert verdict.counterexample.direction == "forward"
    # everything before the side-by-side check ran its calls one at a time and passed them
    assert kernel.calls > 20


def test_an_honest_kernel_passes_side_by_side(gelu):
    verdict = run_verification(gelu, fakes.PyKernel(gelu, fakes.gelu_forward), SMALL, device="cpu")
    assert verdict.passed, verdict.summary()
    assert "phase_s side-by-side" in verdict.timings, sorted(verdict.timings)


def test_work_left_on_another_stream_is_a_stream_violation(gelu):
    """Held-out attacks-v5's softmax ran small calls on cudaStreamPerThread and left `stream` an
    empty kernel: every value right after a device sync, so it passed every other check on the
    H200 (session 26). A copy queued on `stream` behind the call sees the outputs unfinished."""
    verdict = run_verification(gelu, fakes.OffloadingKernel(gelu), SMALL, device="cpu")
    assert verdict.reason == "stream-violation", verdict.summary()
    assert "not finished when `stream` reached the end of the call" in verdict.detail


def test_each_call_side_by_side_gets_a_workspace_of_its_own(gelu, monkeypatch):
    """Scratch in the workspace the ABI hands each call is the honest way: two calls at once get
    two workspaces (review of session 26). Handing both the same one is what a static buffer does,
    and the check sees it."""
    from specgen.verify import isolation

    assert run_verification(gelu, fakes.StagedThroughWorkspace(gelu), SMALL, device="cpu").passed
    own = isolation.RunnerBase.workspaces
    monkeypatch.setattr(isolation.RunnerBase, "workspaces", lambda self: [own(self)[0]] * 2 if own(self) else [])
    verdict = run_verification(gelu, fakes.StagedThroughWorkspace(gelu), SMALL, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    # the first calls (two at once, version 8) or the calls side by side: both hand each call its own
    assert "at the same time on another stream" in verdict.detail or "the process's first calls" in verdict.detail
