"""Calls from two host threads at the same time (specgen/verify/threaded.py, verifier version 8):
a kernel whose host code keeps its launch plan (pointers included) in one `static` struct is
right from one thread and wrong from two (held-out rope, session 30). On a GPU the candidate's
process calls a compiled kernel from native threads (threaded.DRIVER_SOURCE); the nvcc tests
below run that driver on the CPU over host-only "kernels" (the CPU runner's tensors are host
memory). The stand-ins run in real Python threads (LocalRunner.threads); a "plan" kept in a
module-level global, set and then read after the GIL was let go, is the same race."""
from __future__ import annotations

import threading
import time

import pytest
import torch

import verify_fakes as fakes
from host_only_kernels import compiled_library, scale_spec
from specgen.spec import load_spec
from specgen.verify import engine, isolation
from specgen.verify.data import prepare
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import LocalRunner
from specgen.verify.runner import run_once
from specgen.verify.strategies import make_case
from specgen.verify.threaded import (RECORD_BYTES, THREAD_CALLS, check_calls_from_threads, stage_apart,
                                     thread_pairs)
from specgen.verify.verdict import Failure

SMALL = Options(examples=4, budget=1 << 13, seed=1)

_PLAN: dict = {}  # the "host static struct": one launch plan for every caller


def planned_forward(k, t, dims):
    """GELU through a host plan kept between calls: set it, do the launch's host work (the GIL is
    let go, as a CUDA launch lets it go), then launch from the plan: its pointers may be another
    thread's by then."""
    _PLAN["plan"] = (t["x"], t["out"])
    time.sleep(0)
    x, out = _PLAN["plan"]
    out.copy_(fakes._gelu(x))


class SkipsOneCallOffTheMainThread(fakes.PyKernel):
    """Skips the 60th call made from any thread but the main one (returns success, writes
    nothing): a later call on the same outputs would hide it; an output set per call does not."""

    def __init__(self, spec):
        super().__init__(spec, fakes.gelu_forward)
        self.lock, self.off_main = threading.Lock(), 0

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        if threading.current_thread() is not threading.main_thread():
            with self.lock:
                self.off_main += 1
                skip = self.off_main == 60
            if skip:
                return 0
        return super().call(direction, tensors, scalars, dims, stream)


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


def pair(spec, first: dict, second: dict, dtype: str = "float32"):
    return [prepare(spec, make_case(dims, dtype, seed=seed), "forward", "cpu")
            for seed, dims in ((11, first), (12, second))]


def check(spec, kernel, first: dict, second: dict, **kw):
    runner = LocalRunner(spec, kernel, "cpu")
    check_calls_from_threads(runner, pair(spec, first, second), deterministic=spec.deterministic, **kw)
    return runner


@pytest.mark.parametrize("second", [{"N": 3, "D": 37}, {"N": 64, "D": 129}])
def test_an_honest_kernel_passes_from_two_threads(gelu, second):
    kernel = fakes.PyKernel(gelu, fakes.gelu_forward)
    check(gelu, kernel, {"N": 64, "D": 129}, second)
    assert kernel.calls == 2 + 2 * THREAD_CALLS  # each alone, then each thread's calls


def test_each_thread_gets_a_workspace_of_its_own(gelu):
    kernel = fakes.WorkspaceKernel(gelu, fakes.gelu_via_workspace, lambda dims: 4 * dims["N"] * dims["D"])
    runner = check(gelu, kernel, {"N": 64, "D": 129}, {"N": 3, "D": 37})
    assert len(runner.workspaces()) == 2
    assert len({ws.offset for ws in runner.workspaces()}) == 2
    assert {given for _, _, given, _ in kernel.seen} == {4 * 64 * 129, 4 * 3 * 37}  # each asks for its own call


def test_a_host_plan_shared_by_threads_is_caught(gelu):
    with pytest.raises(Failure) as caught:
        check(gelu, fakes.PyKernel(gelu, planned_forward), {"N": 64, "D": 129}, {"N": 3, "D": 37})
    assert caught.value.reason == "wrong-result", caught.value.detail
    assert caught.value.detail.startswith("called from host threads at the same time (call ")
    assert "`static` struct" in caught.value.detail


def test_a_host_plan_is_caught_at_one_shape_too(gelu):
    """Same shape, other pointers and values: a launch with the other thread's plan writes the
    other thread's outputs and leaves its own unwritten."""
    with pytest.raises(Failure) as caught:
        check(gelu, fakes.PyKernel(gelu, planned_forward), {"N": 8, "D": 37}, {"N": 8, "D": 37})
    assert caught.value.reason == "wrong-result"
    assert "called from host threads at the same time" in caught.value.detail


def test_the_single_thread_checks_pass_a_host_plan(gelu, monkeypatch):
    """Every other check calls from one host thread: the plan is always the caller's own."""
    monkeypatch.setattr(engine, "check_calls_from_threads", lambda *args, **kw: None, raising=False)
    verdict = run_verification(gelu, fakes.PyKernel(gelu, planned_forward), SMALL, device="cpu")
    assert verdict.passed, verdict.summary()


def test_the_engine_runs_it(gelu):
    verdict = run_verification(gelu, fakes.PyKernel(gelu, planned_forward), SMALL, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert "called from host threads at the same time" in verdict.detail
    assert run_verification(gelu, fakes.PyKernel(gelu, fakes.gelu_forward), SMALL, device="cpu").passed


def test_a_call_skipped_mid_loop_is_seen(gelu):
    """Each call writes an output set of its own: the 60th call of 200 skipped is not hidden by
    the 61st writing the same outputs again."""
    with pytest.raises(Failure) as caught:
        check(gelu, SkipsOneCallOffTheMainThread(gelu), {"N": 8, "D": 37}, {"N": 4, "D": 65})
    assert caught.value.reason == "wrong-result"
    assert "called from host threads at the same time" in caught.value.detail


def test_output_sets_are_bounded_by_the_record_bytes(gelu):
    runner = LocalRunner(gelu, fakes.PyKernel(gelu, fakes.gelu_forward), "cpu")
    big_rows = RECORD_BYTES // (4 * 1024) // 3  # a third of the record in one output
    cases = pair(gelu, {"N": big_rows, "D": 1024}, {"N": 3, "D": 37})
    sets = stage_apart(runner, cases)
    assert len(sets[0]) == 3 and len(sets[1]) == THREAD_CALLS
    assert all(cases[i].output_refs == sets[i][0] for i in (0, 1))
    offsets = [ref.offset for mine in sets for refs in mine for ref in refs.values()]
    assert len(set(offsets)) == len(offsets)
    assert torch.equal(runner.tensor(cases[1].input_refs["x"]), cases[1].inputs["x"])


def test_a_failing_call_names_its_thread(gelu):
    def fails_small(k, t, dims):
        if threading.current_thread() is not threading.main_thread() and dims["N"] == 3:
            return 9
        fakes.gelu_forward(k, t, dims)

    with pytest.raises(Failure) as caught:
        check(gelu, fakes.PyKernel(gelu, fails_small), {"N": 64, "D": 129}, {"N": 3, "D": 37})
    assert caught.value.reason == "cuda-error"
    assert "on N=3 D=37 float32" in caught.value.detail  # the case of the thread whose call failed


def test_the_pairs(gelu):
    spec = gelu
    session = engine.Session(spec, None, SMALL, lambda text: None, "cpu")
    from specgen.verify.strategies import large_case

    big = large_case(spec, SMALL.budget, SMALL.seed + 7)
    bound = session.launch_bound_cases()
    pairs = thread_pairs(big, bound)
    assert pairs[0][0].dim_map == big.dim_map and pairs[0][1].dim_map == bound[0].dim_map
    assert pairs[-1][0].dim_map == pairs[-1][1].dim_map and pairs[-1][0].seed != pairs[-1][1].seed
    assert len(pairs) == (3 if bound[-1].dim_map != bound[0].dim_map else 2)


def test_lone_calls_are_lists_of_one():
    assert isolation.per_thread([{"a": 1}, [{"b": 2}, {"c": 3}]]) == [[{"a": 1}], [{"b": 2}, {"c": 3}]]


# ------------------------------------------------------------------ native threads (nvcc, no GPU)

# Host-only "kernels" (the CPU runner's tensors are host memory): the calls' host code is all
# there is, which is where a plan race lives. `plan` keeps the launch plan in a static struct.
HOST_KERNEL = """\
#include <sched.h>
#include <cuda_runtime.h>
#include "scale_abi.h"
struct Plan { const float* x; float* out; long n; double alpha; };
%(plan)s
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  %(local)s
  plan.x = (const float*)a->x.data; plan.out = (float*)a->out.data; plan.n = a->N * a->D; plan.alpha = a->alpha;
  for (volatile int spin = 0; spin < 2000; ++spin) {}  // the launch's host work (a device query, packing)
  sched_yield();  // ... which may wait (on one core the other thread then runs): the plan is read again after
  for (long i = 0; i < plan.n; ++i) plan.out[i] = (float)(plan.x[i] * plan.alpha);
  return cudaSuccess;
}
"""


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    return scale_spec(tmp_path_factory)


def host_library(spec, tmp_path, shared: bool):
    return compiled_library(spec, HOST_KERNEL % ({"plan": "static Plan plan;", "local": ""} if shared else
                                                 {"plan": "", "local": "Plan plan;"}), tmp_path)


def scale_pair(spec):
    return [prepare(spec, make_case(dims, "float32", seed=seed), "forward", "cpu")
            for seed, dims in ((21, {"N": 64, "D": 256}), (22, {"N": 3, "D": 37}))]


@pytest.mark.nvcc
def test_native_threads_catch_a_static_plan_and_pass_a_local_one(scale, tmp_path):
    from specgen.verify.threaded import native_driver

    driver = native_driver()
    assert driver, "the threads driver did not build"
    honest = LocalRunner(scale, host_library(scale, tmp_path, shared=False), "cpu")
    check_calls_from_threads(honest, scale_pair(scale), deterministic=True, driver=driver)
    shared = LocalRunner(scale, host_library(scale, tmp_path, shared=True), "cpu")
    for data in scale_pair(scale):  # one thread at a time it is right
        stage_apart(shared, [data])
        out = run_once(shared, data, 0)
        assert torch.equal(out["out"], (data.inputs["x"].double() * 2.0).float())
    caught = []
    for _ in range(3):
        try:
            check_calls_from_threads(shared, scale_pair(scale), deterministic=True, driver=driver)
        except Failure as failure:
            caught.append(failure)
            break
    assert caught, "a static plan passed the calls from two native threads three times"
    assert caught[0].reason in ("wrong-result", "out-of-bounds"), caught[0].detail
    assert "host threads at the same time" in caught[0].detail


@pytest.mark.nvcc
def test_native_threads_ask_the_size_function_before_each_call(scale, tmp_path):
    """The driver asks the size function before every call and hands the kernel what it asked;
    more than was placed is a bad-workspace, and the kernel is not called."""
    from specgen.verify import static_checks
    from specgen.verify.threaded import native_driver

    source = HOST_KERNEL % {"plan": "", "local": "Plan plan;"} + """
#include <pthread.h>
static pthread_t first_asker;  // the judge's thread: it stages the case and calls it alone first
static int have_first = 0, off_main = 0;
extern "C" size_t scale_forward_workspace(const scale_args* a) {
  if (a->workspace != nullptr || a->workspace_bytes != 0) return (size_t)1 << 40;  // must come empty
  if (!have_first) { first_asker = pthread_self(); have_first = 1; }
  bool main_thread = pthread_equal(pthread_self(), first_asker);
  return !main_thread && __atomic_add_fetch(&off_main, 1, __ATOMIC_SEQ_CST) == 150 ? (size_t)1 << 20 : 4096;
}
"""
    verdict, compiled = static_checks(scale, source, arch="sm_90", cache_dir=tmp_path)
    assert verdict is None, verdict.summary()
    runner = LocalRunner(scale, compiled.library, "cpu")
    with pytest.raises(Failure) as caught:
        check_calls_from_threads(runner, scale_pair(scale), deterministic=True, driver=native_driver())
    assert caught.value.reason == "bad-workspace", caught.value.detail
    assert "asked for 1048576 bytes of workspace right before a call, more than the 4096 bytes placed" \
        in caught.value.detail
