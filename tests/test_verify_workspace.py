"""The kernel's workspace in the verifier, on a CPU with Python stand-ins (tests/verify_fakes.py):
sized by the kernel's size function, placed in its own guarded arena, filled with random bytes
before every call; unbelievable sizes, state kept between calls and writes past its end rejected.
(The compiled path, ctypes and the candidate's process, runs on the GPU: test_adversarial.py.)"""
from __future__ import annotations

import pytest

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify.data import WORKSPACE_FLOOR, workspace_problem
from specgen.verify.engine import Options, run_verification

SMALL = Options(examples=4, budget=1 << 13, seed=1)


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


def output_bytes(dims) -> int:
    return 4 * dims["N"] * dims["D"]  # float32 scratch of the output's size


def verdict_of(spec, kernel):
    return run_verification(spec, kernel, SMALL, device="cpu")


def test_believable_sizes_pass_and_absurd_ones_are_named():
    assert workspace_problem([], 100) is None
    assert workspace_problem([0, 1000], 100) is None
    assert workspace_problem([WORKSPACE_FLOOR], 100) is None  # 64 MiB for any call
    assert workspace_problem([4 << 30], 1 << 30) is None  # 4x the call's tensor bytes
    assert "more than the 4294967296 bytes" in workspace_problem([(4 << 30) + 1], 1 << 30)
    problem = workspace_problem([(1 << 64) - 1], 100)  # (size_t)-1
    assert problem and "negative number or garbage" in problem


def test_a_kernel_using_its_workspace_honestly_passes_and_gets_fresh_random_bytes(gelu, monkeypatch):
    from specgen.verify import engine

    kernel = fakes.WorkspaceKernel(gelu, fakes.gelu_via_workspace, output_bytes)
    # (without the endurance run and the calls from two threads: their calls in a row, as from a
    # captured graph, are not refilled; tests/test_verify_threaded.py checks those)
    monkeypatch.setattr(engine, "check_calls_from_threads", lambda *a, **k: None)
    verdict = run_verification(gelu, kernel, Options(examples=4, budget=1 << 13, seed=1, endurance=0), device="cpu")
    assert verdict.passed, verdict.summary()
    forward = [seen[1:] for seen in kernel.seen if seen[0] == "forward"]
    assert forward and all((given is None) == (asked == 0) for asked, given, _ in forward)
    assert all(given >= asked for asked, given, _ in forward if given)
    # filled anew before every call: no two calls find the same first bytes
    heads = [bytes(head.tolist()) for asked, _, head in forward if asked >= 16]
    assert len(heads) > 10 and len(set(heads)) == len(heads)


def test_a_kernel_without_a_size_function_gets_no_workspace(gelu):
    kernel = fakes.WorkspaceKernel(gelu, fakes.gelu_forward, lambda dims: 0)
    assert verdict_of(gelu, kernel).passed
    assert all(given is None for _, _, given, _ in kernel.seen)


def test_state_kept_in_the_workspace_between_calls_is_rejected(gelu):
    """Right on its first call (it zeroes the counter), wrong from the second on: the workspace
    holds random bytes on entry (tests/adversarial/workspace_counter_kept.cu on the GPU)."""
    kernel = fakes.WorkspaceKernel(gelu, fakes.counter_kept_in_workspace, lambda dims: 8)
    verdict = verdict_of(gelu, kernel)
    # its first call zeroes the counter: the smoke case's run A right, run B skipping rows; since
    # version 8 that first call is the first calls' check, so both smoke runs skip them
    assert verdict.reason in ("nondeterministic", "unwritten-output"), verdict.summary()


def test_a_write_past_the_workspace_is_out_of_bounds(gelu):
    kernel = fakes.WorkspaceKernel(gelu, fakes.writes_past_workspace, output_bytes)
    verdict = verdict_of(gelu, kernel)
    assert verdict.reason == "out-of-bounds", verdict.summary()
    assert "workspace" in verdict.detail


def test_an_absurd_size_is_a_clear_verdict(gelu):
    kernel = fakes.WorkspaceKernel(gelu, fakes.gelu_forward, lambda dims: (1 << 64) - 1)
    verdict = verdict_of(gelu, kernel)
    assert verdict.reason == "bad-workspace", verdict.summary()
    assert "gelu_tanh_forward_workspace" in verdict.detail and "garbage" in verdict.detail
    assert not kernel.seen  # refused before any call


@pytest.mark.nvcc
def test_the_library_asks_a_compiled_size_function_through_ctypes(gelu, tmp_path):
    """Host code only (no GPU): the size function's answer as the candidate's process reads it,
    a negative int64 returned as size_t included."""
    import torch

    from conftest import REPO
    from specgen.verify import static_checks
    from specgen.verify.library import KernelLibrary

    dims = {"N": 3, "D": 100}
    tensors = {"x": torch.zeros(3, 100), "out": torch.zeros(3, 100)}
    answers = {}
    for name in ("kernels/gelu_tanh__workspace.cu", "adversarial/workspace_size_negative.cu", "kernels/gelu_tanh.cu"):
        verdict, compiled = static_checks(gelu, REPO / "tests" / name, arch="sm_90", cache_dir=tmp_path)
        assert verdict is None, verdict.summary()
        library = KernelLibrary(gelu, compiled.library)
        answers[name] = library.workspace_bytes("forward", tensors, {}, dims)
        assert library.sized() == ([] if name == "kernels/gelu_tanh.cu" else ["forward"])
    assert answers["kernels/gelu_tanh__workspace.cu"] == 4 * 300
    negative = answers["adversarial/workspace_size_negative.cu"]
    assert negative == (300 - 1024) * 4 + (1 << 64) and "garbage" in workspace_problem([negative], 2400)
    assert answers["kernels/gelu_tanh.cu"] == 0  # no size function: no workspace


def test_the_candidates_process_is_asked_only_for_directions_with_a_size_function():
    """A staged case asks the candidate's process for its workspace only where the loaded
    library defines a size function for the case's direction (a round trip per case saved)."""
    from specgen.verify.isolation import IsolatedRunner, Outcome

    runner = object.__new__(IsolatedRunner)  # no process: the request is the stand-in below
    asked = []
    runner._request = lambda message, timeout=None: asked.append(message) or Outcome(sizes=[64] * len(message["calls"]))
    calls = [{"direction": "backward", "tensors": {}, "scalars": {}, "dims": {}}] * 2
    runner._sized = {"forward"}
    assert runner.workspace_sizes(calls) == [0, 0] and not asked
    runner._sized = {"forward", "backward"}
    assert runner.workspace_sizes(calls) == [64, 64] and len(asked) == 1
    runner._sized = None  # not loaded yet: ask
    assert runner.workspace_sizes(calls) == [64, 64] and len(asked) == 2
