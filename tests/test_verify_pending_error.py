"""An error left pending by a call that returned success (verifier version 16,
specgen/verify/pending_error.py): after every call that returns 0 the calling thread's runtime is
asked (cudaPeekAtLastError, through the kernel's own libcudart) and an error found is cleared and
rejected as cuda-error; an error code returned is the ordinary cuda-error, not this one; torch's
own leftovers before a call are not the kernel's. Host-only: a C stand-in runtime with a per-thread
last error (tests/fake_cudart.py) loaded by ctypes, Python stand-ins, and the judge's side of the
candidate's reply."""
from __future__ import annotations

import subprocess
import threading
import types

import pytest
import torch

import verify_fakes as fakes
from fake_cudart import build_fake_runtime, c_compiler
from specgen.spec import load_spec
from specgen.verify.data import prepare, stage
from specgen.verify.isolation import CpuStream, IsolatedRunner, LocalRunner
from specgen.verify.library import KernelLibrary
from specgen.verify.pending_error import ErrorWatch, pending_error_failure, pending_report
from specgen.verify.runner import raise_outcome, run_once
from specgen.verify.strategies import make_case
from specgen.verify.verdict import CUDA_ERROR, Failure

FAKE_SONAME = "libspecgen_fake_cudart.so"  # not libcudart.so.13: torch loaded the real one in this process
REPORT = {"code": 215, "error": "cudaErrorUnsupportedLimit", "direction": "forward", "main_thread": True}
DETAIL = ("gelu_tanh_forward returned success but left cudaErrorUnsupportedLimit pending: the caller's next error "
          "check (PyTorch's C10_CUDA_KERNEL_LAUNCH_CHECK) raises it from an unrelated op")


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """The stand-in runtime, loaded here: its hooks record errors in the calling thread."""
    import ctypes

    library = build_fake_runtime(tmp_path_factory.mktemp("fake_rt"), FAKE_SONAME)
    runtime = ctypes.CDLL(str(library))
    runtime.fake_leave.argtypes = runtime.fake_sticky.argtypes = [ctypes.c_int]
    runtime.fake_leave.restype = runtime.fake_sticky.restype = None
    return runtime


@pytest.fixture(autouse=True)
def clean(fake):
    fake.fake_sticky(0)
    fake.cudaGetLastError()
    yield
    fake.fake_sticky(0)
    fake.cudaGetLastError()


# ------------------------------------------------------------------ the judge's logic

def test_the_verdict_names_the_error_and_the_fix(gelu):
    failure = pending_error_failure(gelu, {"op": "call", "direction": "forward"}, {**REPORT, "op": "call"})
    assert failure.reason == CUDA_ERROR and failure.detail.startswith(DETAIL)
    assert "seen after one call: cudaPeekAtLastError in the calling thread returned cudaErrorUnsupportedLimit (215)" \
        in failure.detail
    assert "Clear errors of optional setup with cudaGetLastError, or return them" in failure.detail
    threaded = pending_error_failure(gelu, {"op": "threads"}, {**REPORT, "main_thread": False, "op": "threads"})
    assert "calls from host threads at the same time, in a host thread of its own" in threaded.detail


def fake_isolated(spec, reply: dict, monkeypatch) -> IsolatedRunner:
    """An IsolatedRunner whose candidate's process answers `reply` (no process, no GPU)."""
    runner = IsolatedRunner.__new__(IsolatedRunner)
    runner.spec, runner.dead, runner.call_timeout = spec, None, 5.0
    runner.channel = types.SimpleNamespace(send=lambda message, fds=(): None)
    runner._receive = lambda timeout: reply
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return runner


def test_the_judge_rejects_what_the_candidate_process_reports(gelu, monkeypatch):
    message = {"op": "call", "direction": "forward", "tensors": {}, "scalars": {}, "dims": {}}
    runner = fake_isolated(gelu, {"type": "done", "code": 0, "pending_error": {**REPORT, "op": "call"}}, monkeypatch)
    with pytest.raises(Failure) as caught:
        runner._request(message)
    assert caught.value.reason == CUDA_ERROR and caught.value.detail.startswith(DETAIL)
    clean = fake_isolated(gelu, {"type": "done", "code": 0}, monkeypatch)._request(message)
    assert clean.code == 0  # success with nothing pending passes
    returned = fake_isolated(gelu, {"type": "done", "code": 215, "error": "cudaErrorUnsupportedLimit"},
                             monkeypatch)._request(message)
    assert returned.code == 215  # an error code returned: the ordinary cuda-error, not this failure
    data = prepare(gelu, make_case({"N": 2, "D": 3}, "float32", seed=1), "forward", "cpu")
    with pytest.raises(Failure) as caught:
        raise_outcome(gelu, data, returned)
    assert caught.value.reason == CUDA_ERROR and "returned cudaErrorUnsupportedLimit (215)" in caught.value.detail
    assert "left" not in caught.value.detail


def test_the_candidate_process_reports_only_what_it_should():
    class Lib:
        def __init__(self):
            self.report = dict(REPORT)

        def take_pending(self):
            report, self.report = self.report, None
            return report

    lib = Lib()
    assert pending_report(lib, "call", {"type": "done", "code": 0}) == {**REPORT, "op": "call"}
    assert pending_report(lib, "call", {"type": "done"}) is None  # taken once: the next request starts clean
    lib = Lib()
    assert pending_report(lib, "call", {"type": "fatal"}) is None and lib.report is None  # lost context: crash
    lib = Lib()
    assert pending_report(lib, "capture", {"type": "captured", "ok": False}) is None  # not-capturable says more
    assert Lib().take_pending() is not None
    assert pending_report(Lib(), "capture", {"type": "captured", "ok": True})["op"] == "capture"


# ------------------------------------------------------------------ the watch, on a native per-thread runtime

def test_a_call_that_leaves_an_error_pending_is_recorded_and_cleared(fake):
    watch = ErrorWatch(fake)
    assert watch.wrap(lambda: fake.fake_leave(215) or 0, "forward")() == 0
    assert fake.cudaPeekAtLastError() == 0  # cleared: the next call starts clean
    assert watch.take() == REPORT and watch.take() is None
    assert watch.wrap(lambda: 0, "backward")() == 0 and watch.take() is None  # nothing pending: nothing recorded


def test_an_error_code_returned_is_not_this_failure(fake):
    watch = ErrorWatch(fake)

    def refused() -> int:
        return fake.cudaDeviceSetLimit(1 << 20, 0)  # a limit no device has: 215, recorded

    assert watch.wrap(refused, "forward")() == 215
    assert watch.take() is None and fake.cudaPeekAtLastError() == 215  # left for the error name, then cleared


def test_an_error_pending_before_the_call_is_not_the_kernels(fake):
    watch = ErrorWatch(fake)
    fake.fake_leave(801)  # torch's own, or an earlier call's returned error
    assert watch.wrap(lambda: 0, "forward")() == 0
    assert watch.take() is None and watch.cleared_before == 1 and watch.off is None


def test_an_error_nothing_clears_turns_the_watch_off(fake):
    """No driver (a CPU-only host) or a lost context: every peek answers the same error, which is not a call's."""
    watch = ErrorWatch(fake)
    fake.fake_sticky(35)
    assert watch.wrap(lambda: fake.fake_leave(215) or 0, "forward")() == 0
    assert watch.take() is None and "cudaErrorInsufficientDriver (35) stays pending" in watch.off
    fake.fake_sticky(0)
    assert watch.wrap(lambda: fake.fake_leave(215) or 0, "forward")() == 0 and watch.take() is None  # stays off
    fake.cudaGetLastError()
    lost = ErrorWatch(fake)
    assert lost.wrap(lambda: fake.fake_leave(700) or 0, "forward")() == 0 and lost.take() is None  # crash's business


def test_the_error_is_the_calling_threads(fake):
    """The runtime's last error is per host thread: a call from another thread is watched there."""
    watch = ErrorWatch(fake)
    launch = watch.wrap(lambda: fake.fake_leave(215) or 0, "forward")
    seen = {}

    def other():
        seen["code"] = launch()
        seen["peek"] = fake.cudaPeekAtLastError()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == {"code": 0, "peek": 0} and fake.cudaPeekAtLastError() == 0
    assert watch.take() == {**REPORT, "main_thread": False}


# ------------------------------------------------------------------ wired: the library and the runner

KERNEL = """
void fake_leave(int code);
int gelu_tanh_forward(const void* args, void* stream) {
  (void)args; (void)stream;
  if (MODE >= 1) fake_leave(215);  /* a refused set-aside whose error nobody read */
  return MODE == 2 ? 215 : 0;      /* 2: the refusal returned */
}
"""


def kernel_library(spec, tmp_path, mode: int) -> KernelLibrary:
    """A library whose forward reaches the stand-in runtime, as a kernel its libcudart."""
    cc = c_compiler()
    runtime = build_fake_runtime(tmp_path / "rt", FAKE_SONAME)
    (tmp_path / "k.c").write_text(KERNEL)
    path = tmp_path / f"k{mode}.so"
    subprocess.run([cc, "-shared", "-fPIC", f"-DMODE={mode}", "-o", str(path), str(tmp_path / "k.c"),
                    f"-L{runtime.parent}", f"-l:{FAKE_SONAME}", f"-Wl,-rpath,{runtime.parent}"], check=True)
    return KernelLibrary(spec, path)


def test_the_library_watches_every_launch_through_its_own_runtime(gelu, tmp_path):
    data = prepare(gelu, make_case({"N": 2, "D": 3}, "float32", seed=2), "forward", "cpu")
    tensors = {"x": torch.randn(2, 3), "out": torch.empty(2, 3)}
    for mode, code, pending in ((0, 0, None), (1, 0, REPORT), (2, 215, None)):
        lib = kernel_library(gelu, tmp_path / str(mode), mode)
        assert lib.call("forward", tensors, {}, data.dims, CpuStream.of("pool")) == code
        assert lib.take_pending() == pending, mode
        lib.clear_error()


def test_the_cpu_runner_rejects_it(gelu, tmp_path):
    lib = kernel_library(gelu, tmp_path, 1)
    runner = LocalRunner(gelu, lib, "cpu")
    data = prepare(gelu, make_case({"N": 2, "D": 3}, "float32", seed=3), "forward", "cpu")
    stage(runner, data)
    with pytest.raises(Failure) as caught:
        run_once(runner, data, 0)
    assert caught.value.reason == CUDA_ERROR and caught.value.detail.startswith(DETAIL)
    assert lib.take_pending() is None  # taken by the runner: the next request starts clean


class LeavesOnce(fakes.PyKernel):
    """GELU (right outputs) whose first call leaves an error pending (a stand-in's own take_pending)."""

    def __init__(self, spec, leaves: bool):
        super().__init__(spec, fakes.gelu_forward)
        self.leaves, self.pending = leaves, None

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        if self.leaves and self.calls == 0:
            self.pending = dict(REPORT)
        return super().call(direction, tensors, scalars, dims, stream)

    def take_pending(self):
        pending, self.pending = self.pending, None
        return pending


def test_a_stand_in_is_judged_the_same_way(gelu):
    data = prepare(gelu, make_case({"N": 4, "D": 5}, "float32", seed=4), "forward", "cpu")
    honest = LocalRunner(gelu, LeavesOnce(gelu, leaves=False), "cpu")
    stage(honest, data)
    run_once(honest, data, 0)
    cheat = LocalRunner(gelu, LeavesOnce(gelu, leaves=True), "cpu")
    stage(cheat, data)
    with pytest.raises(Failure) as caught:
        run_once(cheat, data, 0)
    assert caught.value.reason == CUDA_ERROR and "left cudaErrorUnsupportedLimit pending" in caught.value.detail
    run_once(cheat, data, 1)  # reported once: the next call is judged on its own


# ------------------------------------------------------------------ the real runtime without a GPU (nvcc)

HOST_KERNEL = """\
#include <cuda_runtime.h>
#include "scale_abi.h"
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20);  /* fails here: no driver */
  const float* x = (const float*)a->x.data;
  float* out = (float*)a->out.data;
  for (long i = 0; i < a->N * a->D; ++i) out[i] = (float)(x[i] * a->alpha);
  return cudaSuccess;
}
"""


@pytest.mark.nvcc
def test_without_a_driver_the_watch_stays_off(tmp_path, tmp_path_factory):
    """On a host where the real runtime cannot start, its error stays pending whatever clears it:
    the watch turns itself off instead of blaming every kernel (the other host-only tests rely on it)."""
    from host_only_kernels import compiled_library, scale_spec

    spec = scale_spec(tmp_path_factory)
    lib = KernelLibrary(spec, compiled_library(spec, HOST_KERNEL, tmp_path))
    runner = LocalRunner(spec, lib, "cpu")
    data = prepare(spec, make_case({"N": 3, "D": 7}, "float32", seed=5), "forward", "cpu")
    stage(runner, data)
    run_once(runner, data, 0)
    if lib.watch.off is None:
        pytest.skip("this host's CUDA runtime starts (a driver is present): nothing to show here")
    assert "stays pending after cudaGetLastError" in lib.watch.off
