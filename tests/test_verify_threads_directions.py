"""A forward beside a backward from two host threads (specgen/verify/threaded.py, verifier version
10): held-out attacks-v8's swiglu stores "the kernel to launch" in one `static` that both entry
points write and a shared launcher reads, so a forward called beside a backward on another thread
launches the other direction's kernel; every pair of one direction stores the same value and is
exact. The stand-ins run in real Python threads (LocalRunner.threads): the "static" is a module
global, set, then read after the GIL was let go (time.sleep(0), as a CUDA launch's driver queries
let it go), which is the same race. The nvcc test runs the native driver over host-only entry points."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest

import verify_fakes as fakes
from host_only_kernels import compiled_library, scale_spec
from specgen.spec import load_spec
from specgen.verify import engine, threaded
from specgen.verify.data import prepare
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import LocalRunner
from specgen.verify.strategies import large_case, make_case
from specgen.verify.threaded import THREAD_CALLS, check_calls_from_threads, direction_pairs, thread_calls
from specgen.verify.verdict import Failure

SMALL = Options(examples=4, budget=1 << 13, seed=1)
ILLEGAL_ADDRESS = 700

_LAUNCH: dict = {}  # the entry points' shared "static": which kernel the launcher starts


class SharedLauncher(fakes.PyKernel):
    """GELU whose two entry points store the kernel to launch in one process-wide slot, then call
    a launcher that does its host work (the GIL let go) and launches what the slot holds. The
    forward launching the backward's kernel reads grad_out = NULL (an illegal address; with
    `fault=False` it reads zeros there and writes zeros); the backward launching the forward's
    writes gelu(x) into grad_x."""

    def __init__(self, spec, fault: bool = True):
        super().__init__(spec, fakes.gelu_forward, fakes.gelu_backward)
        self.lock, self.swapped, self.fault = threading.Lock(), 0, fault

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.calls += 1
        _LAUNCH["kernel"] = direction
        time.sleep(0)  # the launcher's device queries
        kernel = _LAUNCH["kernel"]
        if kernel != direction:
            with self.lock:
                self.swapped += 1
        if kernel == "backward":
            if "grad_out" not in tensors:
                if self.fault:
                    return ILLEGAL_ADDRESS
                tensors["out"].zero_()
                return 0
            fakes.gelu_backward(self, tensors, dims)
        else:
            tensors["out" if "out" in tensors else "grad_x"].copy_(fakes._gelu(tensors["x"]))
        return 0


class InFlight(fakes.PyKernel):
    """Honest GELU that counts calls made while the other direction is in flight on another
    thread (heldout attacks-v8's DirectionWatch): the overlap the check needs, measured."""

    def __init__(self, spec):
        super().__init__(spec, fakes.gelu_forward, fakes.gelu_backward)
        self.lock, self.now, self.overlaps = threading.Lock(), [], 0

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        with self.lock:
            self.now.append(direction)
            if len(set(self.now)) > 1:
                self.overlaps += 1
        try:
            time.sleep(0)
            return super().call(direction, tensors, scalars, dims, stream)
        finally:
            with self.lock:
                self.now.remove(direction)


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


def cases(spec, *calls, device="cpu"):
    """CaseData of (direction, dims) pairs, each on values of its own."""
    return [prepare(spec, make_case(dims, "float32", seed=31 + i), direction, device)
            for i, (direction, dims) in enumerate(calls)]


def test_the_backward_checks_add_forward_beside_backward_pairs(gelu):
    big = large_case(gelu, SMALL.budget, SMALL.seed + 7)
    bound = engine.Session(gelu, None, SMALL, lambda text: None, "cpu").launch_bound_cases()
    same = threaded.thread_pairs(big, bound)
    forward = thread_calls(big, bound, "forward")
    assert [tuple(way for _, way in pair) for pair in forward] == [("forward", "forward")] * len(same)
    backward = thread_calls(big, bound, "backward")
    mixed = backward[len(same):]
    assert [tuple(way for _, way in pair) for pair in mixed] == [("forward", "backward"), ("backward", "forward"),
                                                                 ("forward", "backward")]
    assert mixed == direction_pairs(big, bound)
    assert mixed[0][0][0].dim_map == big.dim_map and mixed[0][1][0].dim_map == bound[0].dim_map
    assert mixed[1][0][0].dim_map == big.dim_map and mixed[1][1][0].dim_map == bound[0].dim_map
    assert mixed[2][0][0].dim_map == mixed[2][1][0].dim_map and mixed[2][0][0].seed != mixed[2][1][0].seed
    seeds = [case.seed for pair in mixed for case, _ in pair]
    assert len(set(seeds)) == len(seeds)  # every thread's values its own
    assert thread_calls(big, bound, "backward", forward_too=False) == backward[:len(same)]  # backward alone


def test_an_honest_kernel_passes_a_forward_beside_a_backward(gelu):
    kernel = InFlight(gelu)
    runner = LocalRunner(gelu, kernel, "cpu")
    check_calls_from_threads(runner, cases(gelu, ("forward", {"N": 64, "D": 129}), ("backward", {"N": 3, "D": 37})),
                             deterministic=gelu.deterministic)
    assert kernel.calls == 2 + 2 * THREAD_CALLS
    assert kernel.overlaps > 0, "the two directions never overlapped in time: the check would see nothing"


def test_each_thread_gets_its_own_workspace_in_its_own_direction(gelu):
    asked = {"forward": lambda dims: 4 * dims["N"] * dims["D"]}
    kernel = fakes.WorkspaceKernel(gelu, fakes.gelu_via_workspace, asked["forward"])
    runner = LocalRunner(gelu, kernel, "cpu")
    check_calls_from_threads(runner, cases(gelu, ("backward", {"N": 8, "D": 65}), ("forward", {"N": 3, "D": 37})),
                             deterministic=gelu.deterministic)
    assert len(runner.workspaces()) == 2
    assert {direction for direction, _, given, _ in kernel.seen if given} == {"forward", "backward"}


@pytest.mark.parametrize("fault", [True, False])
def test_a_kernel_chosen_through_a_shared_static_is_caught_and_both_threads_named(gelu, fault):
    kernel = SharedLauncher(gelu, fault)
    runner = LocalRunner(gelu, kernel, "cpu")
    with pytest.raises(Failure) as caught:
        check_calls_from_threads(runner, cases(gelu, ("forward", {"N": 64, "D": 129}),
                                               ("backward", {"N": 3, "D": 37})), deterministic=gelu.deterministic)
    detail = caught.value.detail
    assert kernel.swapped > 0
    assert caught.value.reason in ("wrong-result", "crash"), detail
    assert "a forward beside a backward" in detail, detail
    assert "thread 1" in detail and "thread 2" in detail, detail
    assert "forward" in detail and "backward" in detail
    if fault:  # the forward launched the backward's kernel (grad_out NULL): its thread's call fails first
        assert caught.value.reason == "crash", detail
        assert detail.startswith("calls from 2 host threads at the same time, a forward beside a backward (thread 1: "
                                 "the forward on N=64 D=129 float32"), detail
        assert "; thread 2: the backward on N=3 D=37 float32" in detail
        assert "thread 1's call: gelu_tanh_forward returned cudaErrorIllegalAddress" in detail
    else:  # either thread's outputs went wrong
        assert caught.value.reason == "wrong-result", detail
        assert detail.startswith("called from two host threads at the same time, a forward beside a backward (thread ")
        assert ("thread 1 calling the forward, its call" in detail and "thread 2 called the backward on N=3 D=37"
                in detail) or ("thread 2 calling the backward, its call" in detail
                               and "thread 1 called the forward on N=64 D=129" in detail), detail
        assert "which kernel a shared launcher starts kept in a `static`" in detail


def test_the_same_kernel_passes_every_pair_of_one_direction(gelu):
    """Every call of one direction stores the same kernel: the version-8 pairs never see it."""
    for direction in ("forward", "backward"):
        kernel = SharedLauncher(gelu)
        runner = LocalRunner(gelu, kernel, "cpu")
        check_calls_from_threads(runner, cases(gelu, (direction, {"N": 64, "D": 129}), (direction, {"N": 3, "D": 37})),
                                 deterministic=gelu.deterministic)
        assert kernel.swapped == 0


@pytest.fixture
def quick(monkeypatch):
    """The engine's run trimmed to keep these tests short (two boundary cases, no full-size cases, no
    endurance run); the calls from two threads run as always."""
    every = engine.boundary_cases
    monkeypatch.setattr(engine, "boundary_cases", lambda *args, **kw: every(*args, **kw)[:2])
    return Options(examples=1, budget=1 << 13, seed=1, full_size=False, endurance=0)


def test_the_engine_rejects_it_and_passes_it_with_the_new_pairs_off(gelu, quick, monkeypatch):
    honest = InFlight(gelu)
    verdict = run_verification(gelu, honest, quick, device="cpu")
    assert verdict.passed, verdict.summary()
    assert honest.overlaps > 0  # the engine's pairs really have both directions in flight at once
    verdict = run_verification(gelu, SharedLauncher(gelu), quick, device="cpu")
    assert verdict.reason in ("wrong-result", "crash"), verdict.summary()
    assert "a forward beside a backward" in verdict.detail and "thread 2" in verdict.detail, verdict.detail
    monkeypatch.setattr(threaded, "FORWARD_BESIDE_BACKWARD", False)  # the version-8 check: the gap
    kernel = SharedLauncher(gelu)
    verdict = run_verification(gelu, kernel, quick, device="cpu")
    assert verdict.passed, verdict.summary()
    assert kernel.swapped == 0  # no check ever had both directions in flight


def test_the_backward_alone_runs_no_forward(gelu, quick, monkeypatch):
    seen = []
    monkeypatch.setattr(engine, "check_calls_from_threads",
                        lambda runner, data, **kw: seen.append(tuple(d.direction for d in data)))
    verdict = run_verification(gelu, fakes.PyKernel(gelu, fakes.gelu_forward),
                               dataclasses.replace(quick, directions=("backward",)), device="cpu")
    assert verdict.passed, verdict.summary()
    assert seen and {way for calls in seen for way in calls} == {"backward"}  # pairs and the groups of three


# ------------------------------------------------------------------ native threads (nvcc, no GPU)

# Host-only entry points (the CPU runner's tensors are host memory), swiglu_fwd_bwd_threads.cu's
# shape: each stores its "kernel" in one static, then a shared launcher does its host work and
# runs what the static holds. The backward's kernel with the forward's NULL grad_out returns
# cudaErrorIllegalAddress here (on a GPU it faults).
SHARED_LAUNCHER = """\
#include <sched.h>
#include <cuda_runtime.h>
#include "scale_abi.h"
typedef cudaError_t (*kernel_fn)(const float*, const float*, float*, long, double);
static cudaError_t forward_kernel(const float* x, const float* gy, float* out, long n, double alpha) {
  for (long i = 0; i < n; ++i) out[i] = (float)(x[i] * alpha);
  return cudaSuccess;
}
static cudaError_t backward_kernel(const float* x, const float* gy, float* gx, long n, double alpha) {
  if (gy == nullptr) return cudaErrorIllegalAddress;
  for (long i = 0; i < n; ++i) gx[i] = (float)(gy[i] * alpha);
  return cudaSuccess;
}
%(slot)s
static cudaError_t launch(kernel_fn mine, const float* in0, const float* in1, float* out0, long n, double alpha) {
  %(store)s
  for (volatile int spin = 0; spin < 2000; ++spin) {}  // the launcher's device queries
  sched_yield();
  return %(load)s(in0, in1, out0, n, alpha);
}
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  return launch(forward_kernel, (const float*)a->x.data, nullptr, (float*)a->out.data, a->N * a->D, a->alpha);
}
extern "C" cudaError_t scale_backward(const scale_bwd_args* a, cudaStream_t stream) {
  return launch(backward_kernel, (const float*)a->x.data, (const float*)a->grad_out.data, (float*)a->grad_x.data,
                a->N * a->D, a->alpha);
}
"""


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    return scale_spec(tmp_path_factory, backward=True)


def scale_library(spec, tmp_path, shared: bool):
    return compiled_library(spec, SHARED_LAUNCHER % (
        {"slot": "static kernel_fn g_kernel;", "store": "__atomic_store_n(&g_kernel, mine, __ATOMIC_RELAXED);",
         "load": "__atomic_load_n(&g_kernel, __ATOMIC_RELAXED)"} if shared else
        {"slot": "", "store": "", "load": "mine"}), tmp_path)


@pytest.mark.nvcc
def test_native_threads_catch_a_shared_kernel_slot_and_pass_a_local_one(scale, tmp_path):
    from specgen.verify.threaded import native_driver

    driver = native_driver()
    assert driver, "the threads driver did not build"

    def pair():
        return cases(scale, ("forward", {"N": 64, "D": 256}), ("backward", {"N": 3, "D": 37}))

    honest = LocalRunner(scale, scale_library(scale, tmp_path, shared=False), "cpu")
    check_calls_from_threads(honest, pair(), deterministic=True, driver=driver)
    shared = LocalRunner(scale, scale_library(scale, tmp_path, shared=True), "cpu")
    check_calls_from_threads(shared, cases(scale, ("forward", {"N": 64, "D": 256}), ("forward", {"N": 3, "D": 37})),
                             deterministic=True, driver=driver)  # one direction: always right
    caught = []
    for _ in range(3):
        try:
            check_calls_from_threads(shared, pair(), deterministic=True, driver=driver)
        except Failure as failure:
            caught.append(failure)
            break
    assert caught, "a shared kernel slot passed a forward beside a backward from native threads three times"
    assert caught[0].reason in ("wrong-result", "crash"), caught[0].detail
    assert "a forward beside a backward" in caught[0].detail and "thread 2" in caught[0].detail, caught[0].detail
