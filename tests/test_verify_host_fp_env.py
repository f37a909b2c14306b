"""The host's floating-point environment (verifier version 10): a kernel's entry point runs in the
caller's thread, and host code that sets flush-to-zero and denormals-are-zero (MXCSR FTZ/DAZ on
x86-64, FPCR.FZ on aarch64), a rounding mode or a trap there and leaves it set changes the caller's
own CPU float math (held-out attacks-v8's gelu_tanh: exact GPU outputs, the crtfastmath bug). The
candidate's process reads the environment of every thread that calls the kernel around its calls
(candidate_main.fp_state / fp_report, ThreadFpWatch, the native driver) and the judge rejects a
change (host-state-changed). The stand-ins change it through a tiny C library compiled here with the
system's C compiler; the nvcc tests run host-only entry points that change it themselves."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
import types

import pytest
import torch

import verify_fakes as fakes
from host_only_kernels import compiled_library, scale_spec
from specgen.spec import load_spec
from specgen.verify import candidate_main, engine
from specgen.verify.candidate_main import ThreadFpWatch, fp_change_detail, fp_report, fp_save, fp_state
from specgen.verify.data import prepare
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import IsolatedRunner, LocalRunner, host_fp_failure
from specgen.verify.strategies import make_case
from specgen.verify.threaded import check_calls_from_threads
from specgen.verify.verdict import HOST_STATE_CHANGED, REASONS, Failure

ONE = 1.0  # a global: `5e-324 * ONE` is computed when the line runs, never folded at compile time

HELPER = r"""
#include <fenv.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
void set_ftz_daz(void) { _mm_setcsr(_mm_getcsr() | 0x8040u); }
#elif defined(__aarch64__)
void set_ftz_daz(void) {
  unsigned long fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr | (1ul << 24)));
}
#else
void set_ftz_daz(void) {}
#endif
void round_toward_zero(void) { fesetround(FE_TOWARDZERO); }
"""


@pytest.fixture(scope="module")
def fpenv(tmp_path_factory):
    """The C helper: set_ftz_daz() and round_toward_zero() in the calling thread."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the helper that changes the FP environment")
    where = tmp_path_factory.mktemp("fpenv")
    (where / "fpenv.c").write_text(HELPER)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(where / "fpenv.so"), str(where / "fpenv.c"), "-lm"],
                   check=True)
    return ctypes.CDLL(str(where / "fpenv.so"))


@pytest.fixture(autouse=True)
def untouched():
    """Every test leaves this thread's floating-point environment as it found it."""
    before = fp_state()
    assert 5e-324 * ONE != 0.0
    yield
    assert fp_state() == before, "a stand-in's floating-point environment leaked into the test process"
    assert 5e-324 * ONE != 0.0 and 2.2250738585072014e-308 / (2 * ONE) != 0.0


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


class FastMathHost(fakes.PyKernel):
    """GELU whose forward sets FTZ and DAZ in the calling thread and leaves them set (exact
    outputs). `restore`: it puts the environment back before returning (fine). `off_main`: only
    in threads other than the main one. `change`: what it does (the helper's function)."""

    def __init__(self, spec, fpenv, *, restore=False, off_main=False, change="set_ftz_daz"):
        super().__init__(spec, fakes.gelu_forward)
        self.fpenv, self.restore, self.off_main, self.change = fpenv, restore, off_main, change

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        mine = direction == "forward" and not (self.off_main and threading.current_thread() is threading.main_thread())
        saved = fp_save()
        if mine:
            getattr(self.fpenv, self.change)()
        code = super().call(direction, tensors, scalars, dims, stream)
        if mine and self.restore:
            candidate_main.fp_restore(saved)
        return code


@pytest.fixture
def quick(monkeypatch):
    """The engine's run trimmed (two boundary cases, no full-size cases, no endurance run)."""
    every = engine.boundary_cases
    monkeypatch.setattr(engine, "boundary_cases", lambda *args, **kw: every(*args, **kw)[:2])
    return Options(examples=1, budget=1 << 13, seed=1, full_size=False, endurance=0)


def test_the_reason_is_a_reason():
    assert HOST_STATE_CHANGED == "host-state-changed" and HOST_STATE_CHANGED in REASONS


def test_reading_the_environment_sees_what_float_math_sees(fpenv):
    before, saved = fp_state(), fp_save()
    fpenv.set_ftz_daz()
    try:
        assert 5e-324 * ONE == 0.0  # DAZ: Python's own float math flushes now
        assert candidate_main._probe().split()[:2] == ["DAZ", "FTZ"]
        after = fp_state()
    finally:
        report = fp_report(before, saved)  # puts it back
    assert after != before and report == {"thread": 0, "before": before, "after": after}
    if "mxcsr" in before:
        assert after["mxcsr"] == before["mxcsr"] | 0x8040
    assert fp_report(before, saved) is None


def test_a_call_that_leaves_ftz_and_daz_set_is_rejected(gelu, fpenv, quick):
    verdict = run_verification(gelu, FastMathHost(gelu, fpenv), quick, device="cpu")
    assert verdict.reason == "host-state-changed", verdict.summary()
    detail = verdict.detail
    assert detail.startswith("the calling host thread's floating-point environment changed: ")
    if "mxcsr" in fp_state():
        assert ("MXCSR FTZ and DAZ set by a call of gelu_tanh_forward, left set: the caller's CPU float math would "
                "flush subnormals; restore the floating-point environment before returning (MXCSR 0x1f80 before, "
                "0x9fc0 after") in detail, detail
    else:
        assert "set by a call of gelu_tanh_forward, left set" in detail and "flush subnormals" in detail
    # (the `untouched` fixture: this thread's environment was put back)


def test_a_call_that_restores_it_passes(gelu, fpenv, quick):
    kernel = FastMathHost(gelu, fpenv, restore=True)
    verdict = run_verification(gelu, kernel, quick, device="cpu")
    assert verdict.passed, verdict.summary()
    assert kernel.calls > 1000  # every check ran it, the calls from two threads among them


def test_a_rounding_mode_left_changed_is_named(gelu, fpenv):
    runner = LocalRunner(gelu, FastMathHost(gelu, fpenv, change="round_toward_zero"), "cpu")
    data = prepare(gelu, make_case({"N": 4, "D": 33}, "float32", seed=3), "forward", "cpu")
    from specgen.verify.data import stage
    from specgen.verify.runner import run_once

    stage(runner, data)
    with pytest.raises(Failure) as caught:
        run_once(runner, data, 0)
    assert caught.value.reason == HOST_STATE_CHANGED
    assert "rounding mode changed from round to nearest to round toward zero by a call of gelu_tanh_forward, " \
           "left so: the caller's CPU float math would round toward zero" in caught.value.detail, caught.value.detail


def test_a_size_function_that_leaves_it_set_is_named(gelu, fpenv):
    def size(dims):
        fpenv.set_ftz_daz()
        return 64

    runner = LocalRunner(gelu, fakes.WorkspaceKernel(gelu, fakes.gelu_forward, size), "cpu")
    with pytest.raises(Failure) as caught:
        runner.workspace_sizes([{"direction": "forward", "tensors": {}, "scalars": {}, "dims": {"N": 1, "D": 1}}])
    assert caught.value.reason == HOST_STATE_CHANGED
    assert "set by a call of gelu_tanh_forward_workspace, left set" in caught.value.detail


def pair(spec):
    return [prepare(spec, make_case(dims, "float32", seed=seed), "forward", "cpu")
            for seed, dims in ((41, {"N": 16, "D": 65}), (42, {"N": 3, "D": 37}))]


def test_a_thread_left_changed_is_seen_in_its_thread(gelu, fpenv):
    """Only calls off the main thread change it: the calls from two threads see it, in the thread
    that made them (the main thread's own environment never changed)."""
    runner = LocalRunner(gelu, FastMathHost(gelu, fpenv, off_main=True), "cpu")
    with pytest.raises(Failure) as caught:
        check_calls_from_threads(runner, pair(gelu), deterministic=True)
    assert caught.value.reason == HOST_STATE_CHANGED
    detail = caught.value.detail
    assert "set by a call of gelu_tanh_forward from a host thread of its own (thread 1 of the calls from 2 host " \
           "threads at the same time, its call 1)" in detail, detail


def test_an_honest_kernel_passes_from_two_threads(gelu, fpenv):
    check_calls_from_threads(LocalRunner(gelu, FastMathHost(gelu, fpenv, restore=True), "cpu"), pair(gelu),
                             deterministic=True)


def test_a_thread_watch_keeps_the_first_change(fpenv):
    watch = ThreadFpWatch()
    calls = [lambda: 0, lambda: fpenv.set_ftz_daz() or 0, lambda: 0]
    result = {}

    def thread():  # its own thread: its environment ends with it
        wrapped = [watch.wrap(call) for call in calls]
        result["codes"] = [call() for call in wrapped]

    runner = threading.Thread(target=thread)
    runner.start()
    runner.join()
    assert result["codes"] == [0, 0, 0] and watch.calls == 3
    assert watch.change["call"] == 1 and watch.change["after"] != watch.change["before"]
    assert watch.report(2) == {"thread": 2, **watch.change}


def test_the_candidate_process_reports_a_python_thread(gelu, fpenv, monkeypatch):
    """candidate_main._threads (the candidate's process, Python threads): the change comes back in
    the reply as `host_fp`, the thread named."""
    class Stream:
        device = torch.device("cpu")

        def synchronize(self):
            pass

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))
    state = {"streams": [Stream(), Stream()], "lib": None}
    message = {"threads": [[{"direction": "forward"}], [{"direction": "forward"}]], "repeat": 5}

    def prepare_call(item, on):
        return (lambda: fpenv.set_ftz_daz() or 0) if on is state["streams"][1] else (lambda: 0)

    reply = candidate_main._threads(fake_torch, state, message, prepare_call, None)
    assert reply["type"] == "done" and reply["code"] == 0
    assert [r["thread"] for r in reply["host_fp"]] == [2] and reply["host_fp"][0]["call"] == 0
    failure = host_fp_failure(gelu, "threads", "forward", reply["host_fp"][0], threads=2)
    assert failure.reason == HOST_STATE_CHANGED and "thread 2 of the calls from 2 host threads" in failure.detail


def fake_isolated(spec, reply: dict, monkeypatch) -> IsolatedRunner:
    """An IsolatedRunner whose candidate's process answers `reply` (no process, no GPU)."""
    runner = IsolatedRunner.__new__(IsolatedRunner)
    runner.spec, runner.dead, runner.call_timeout, runner.closed = spec, None, 5.0, False
    runner.channel = types.SimpleNamespace(send=lambda message, fds=(): None)
    runner._receive = lambda timeout: reply
    runner.wait_ready = lambda: None
    runner._sized = None
    runner.close = lambda: setattr(runner, "closed", True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return runner


def test_the_judge_rejects_what_the_candidate_process_reports(gelu, monkeypatch):
    report = {"thread": 0, "before": {"mxcsr": 0x1F80, "x87": 0x33F}, "after": {"mxcsr": 0x9FC0, "x87": 0x33F}}
    runner = fake_isolated(gelu, {"type": "done", "code": 0, "host_fp": [report]}, monkeypatch)
    with pytest.raises(Failure) as caught:
        runner._request({"op": "call", "direction": "backward", "tensors": {}, "scalars": {}, "dims": {}})
    assert caught.value.reason == HOST_STATE_CHANGED
    assert "MXCSR FTZ and DAZ set by a call of gelu_tanh_backward, left set: the caller's CPU float math would flush " \
           "subnormals; restore the floating-point environment before returning" in caught.value.detail
    threads = {"op": "threads", "threads": [[{"direction": "forward"}], [{"direction": "backward"}]], "repeat": 3}
    runner = fake_isolated(gelu, {"type": "done", "code": 0, "host_fp": [{**report, "thread": 2, "call": 6}]},
                           monkeypatch)
    with pytest.raises(Failure) as caught:
        runner._request(threads)
    assert "by a call of gelu_tanh_backward from a host thread of its own (thread 2 of the calls from 2 host " \
           "threads at the same time, its call 7)" in caught.value.detail
    runner = fake_isolated(gelu, {"type": "ok", "entries": ["forward"], "host_fp": [report]}, monkeypatch)
    runner.spec = types.SimpleNamespace(path=__file__)
    with pytest.raises(Failure) as caught:
        runner.load(__file__)
    assert "set by loading the kernel library (its load-time code), left set" in caught.value.detail
    assert runner.closed  # no runner is handed back: its process is gone
    assert fake_isolated(gelu, {"type": "done", "code": 0}, monkeypatch)._request({"op": "replay"}).code == 0


def test_the_words_of_other_registers():
    arm = fp_change_detail({"fpcr": 0}, {"fpcr": 1 << 24}, "a call")
    assert arm.startswith("FPCR FZ set by a call, left set: the caller's CPU float math would flush subnormals")
    probe = fp_change_detail({"probe": "nearest"}, {"probe": "DAZ FTZ nearest"}, "a call")
    assert probe.startswith("FTZ and DAZ set by a call, left set: the caller's CPU float math would flush subnormals")
    traps = fp_change_detail({"mxcsr": 0x1F80, "x87": 0x33F}, {"mxcsr": 0x1F80 & ~(1 << 9), "x87": 0x33F}, "a call")
    assert "MXCSR exception traps enabled (divide-by-zero)" in traps and "raise SIGFPE on divide-by-zero" in traps


# ------------------------------------------------------------------ compiled entry points (nvcc, no GPU)

# Host-only "kernels" (the CPU runner's tensors are host memory) whose host code sets FTZ and DAZ
# as held-out attacks-v8's gelu_tanh does: in every call (`everywhere`), or only off the thread
# that asked first (the judge's: the calls alone pass, the threads' calls do not); `restore` puts
# the register back before returning.
HOST_KERNEL = """\
#include <pthread.h>
#include <cuda_runtime.h>
#include "scale_abi.h"
static pthread_t first;
static int have_first = 0;
static inline unsigned long fp_read() {
#if defined(__x86_64__)
  unsigned csr; __asm__ __volatile__("stmxcsr %%0" : "=m"(csr)); return csr;
#elif defined(__aarch64__)
  unsigned long fpcr; __asm__ __volatile__("mrs %%0, fpcr" : "=r"(fpcr)); return fpcr;
#else
  return 0;
#endif
}
static inline void fp_write(unsigned long v) {
#if defined(__x86_64__)
  unsigned csr = (unsigned)v; __asm__ __volatile__("ldmxcsr %%0" : : "m"(csr));
#elif defined(__aarch64__)
  __asm__ __volatile__("msr fpcr, %%0" : : "r"(v));
#endif
}
static inline unsigned long fast(unsigned long v) {
#if defined(__x86_64__)
  return v | 0x8040u;
#else
  return v | (1ul << 24);
#endif
}
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  if (!have_first) { first = pthread_self(); have_first = 1; }
  const unsigned long saved = fp_read();
  const bool mine = %(everywhere)s || !pthread_equal(pthread_self(), first);
  if (mine) fp_write(fast(saved));
  const float* x = (const float*)a->x.data;
  float* out = (float*)a->out.data;
  for (long i = 0; i < a->N * a->D; ++i) out[i] = (float)(x[i] * a->alpha);
  if (mine && %(restore)s) fp_write(saved);
  return cudaSuccess;
}
"""


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    return scale_spec(tmp_path_factory)


def host_library(spec, tmp_path, *, everywhere: bool, restore: bool):
    return compiled_library(spec, HOST_KERNEL % {"everywhere": str(everywhere).lower(),
                                                 "restore": str(restore).lower()}, tmp_path)


def scale_pair(spec):
    return [prepare(spec, make_case(dims, "float32", seed=seed), "forward", "cpu")
            for seed, dims in ((51, {"N": 64, "D": 256}), (52, {"N": 3, "D": 37}))]


@pytest.mark.nvcc
def test_a_compiled_entry_point_is_caught_in_the_calling_thread(scale, tmp_path):
    from specgen.verify.data import stage
    from specgen.verify.runner import run_once

    runner = LocalRunner(scale, host_library(scale, tmp_path, everywhere=True, restore=False), "cpu")
    data = scale_pair(scale)[1]
    stage(runner, data)
    with pytest.raises(Failure) as caught:
        run_once(runner, data, 0)
    assert caught.value.reason == HOST_STATE_CHANGED
    assert "set by a call of scale_forward, left set" in caught.value.detail


@pytest.mark.nvcc
def test_the_native_threads_driver_reads_each_threads_environment(scale, tmp_path):
    from specgen.verify.threaded import native_driver

    driver = native_driver()
    assert driver, "the threads driver did not build"
    honest = LocalRunner(scale, host_library(scale, tmp_path, everywhere=False, restore=True), "cpu")
    check_calls_from_threads(honest, scale_pair(scale), deterministic=True, driver=driver)
    assert candidate_main.native_fp_reports(driver, 2) == []
    off_main = LocalRunner(scale, host_library(scale, tmp_path / "cheat", everywhere=False, restore=False), "cpu")
    with pytest.raises(Failure) as caught:
        check_calls_from_threads(off_main, scale_pair(scale), deterministic=True, driver=driver)
    assert caught.value.reason == HOST_STATE_CHANGED, caught.value.detail
    assert "set by a call of scale_forward from a host thread of its own (thread " in caught.value.detail
    assert "its call 1)" in caught.value.detail
    reports = candidate_main.native_fp_reports(driver, 2)
    assert {r["thread"] for r in reports} == {1, 2} and all(r["call"] == 0 for r in reports)
    if "mxcsr" in fp_state():
        assert all(r["after"]["mxcsr"] == r["before"]["mxcsr"] | 0x8040 for r in reports)
        assert all(r["before"] == fp_state() for r in reports)  # a new thread starts with its creator's
