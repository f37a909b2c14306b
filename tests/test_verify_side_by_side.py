"""Two calls at the same time on two streams (checks.check_calls_side_by_side): scratch kept
outside the workspace the ABI hands each call is shared by concurrent calls. On the CPU the
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


def test_scratch_shared_between_calls_is_caught_only_side_by_side(gelu):
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
