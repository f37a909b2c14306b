"""The verifier calls a kernel as the shipped package calls it (held-out attacks-v6, #7 and #8):
on the legacy default stream (handle 0, what the binding's getCurrentCUDAStream() is in a program
that never makes a stream) and on cudaStreamPerThread as well as on a stream of its own, and with
the size function asked right before every call (the binding's `attach_workspace(args, <size
fn>(&args), ...)`, then the entry point). On a CPU with stand-ins (tests/verify_fakes.py), and the
compiled path's launcher through ctypes on a host-only C stub."""
from __future__ import annotations

import collections
import shutil
import subprocess
import types

import pytest
import torch

import verify_fakes as fakes
from conftest import SPECS
from specgen import abi
from specgen.spec import load_spec
from specgen.verify import engine
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import CpuStream, IsolatedRunner, LocalRunner, Outcome

SMALL = Options(examples=4, budget=1 << 13, seed=1)


@pytest.fixture(scope="module")
def gelu():
    return load_spec(SPECS / "gelu_tanh.yaml")


def every_call_on_a_pool_stream(monkeypatch) -> None:
    """The verifier as it was (version 5): every checked call on a stream of its own."""
    monkeypatch.setattr(engine, "SMOKE_STREAM", "pool")
    monkeypatch.setattr(engine, "LOOP_STREAM", "pool")
    monkeypatch.setattr(engine, "BOUNDARY_STREAMS", ("pool",))
    monkeypatch.setattr(engine, "FULL_SIZE_STREAMS", ("pool",))
    # (version 16) short-lived threads call on the legacy stream by design, a thread that never made a
    # stream; they check the heap, not outputs (thread_exit.py)
    monkeypatch.setattr(engine, "check_heap_over_threads", lambda *args, **kw: None)


def recording(kernel):
    """`kernel` with the kind of stream of each of its calls counted in `kernel.kinds`."""
    kernel.kinds = collections.Counter()
    call = kernel.call

    def recorded(direction, tensors, scalars, dims, stream):
        kernel.kinds[stream.kind] += 1
        return call(direction, tensors, scalars, dims, stream)
    kernel.call = recorded
    return kernel


# ------------------------------------------------------------------ the stream a call runs on

def test_calls_run_on_the_legacy_stream_per_thread_and_a_stream_of_their_own(gelu, monkeypatch):
    """An honest kernel passes; a good share of its calls (smoke, a third of the boundary cases,
    the repeated calls and the model's loop) get handle 0, some cudaStreamPerThread. (Without the
    calls from two threads: their 1200 calls on streams of their own would swamp the count.)"""
    from specgen.verify import engine

    monkeypatch.setattr(engine, "check_calls_from_threads", lambda *a, **k: None)
    kernel = recording(fakes.correct(gelu))
    verdict = run_verification(gelu, kernel, Options(examples=4, budget=1 << 13, seed=1, endurance=0), device="cpu")
    assert verdict.passed, verdict.summary()
    kinds = kernel.kinds
    assert set(kinds) == {"pool", "legacy", "per_thread"}, kinds
    assert kinds["legacy"] >= 0.3 * sum(kinds.values()), kinds
    assert kinds["per_thread"] >= 0.1 * sum(kinds.values()), kinds


def test_the_smoke_case_runs_on_the_legacy_stream(gelu):
    kernel = recording(fakes.correct(gelu))
    run_verification(gelu, kernel, Options(examples=0, budget=1 << 13, seed=1, full_size=False, endurance=0,
                                           directions=("forward",)), device="cpu")
    assert kernel.kinds["legacy"] >= 2


def test_a_memo_on_the_default_streams_is_rejected_and_the_stream_named(gelu):
    """rmsnorm_memo_blocking_stream: a call that repeats the pointers of one of the last 64 on a
    default stream returns at once. The smoke case's second run, on the legacy stream, keeps its
    fill; the counterexample says which stream."""
    kernel = fakes.MemoOnDefaultStreams(gelu)
    verdict = run_verification(gelu, kernel, SMALL, device="cpu")
    assert verdict.reason == "nondeterministic", verdict.summary()
    assert kernel.skipped >= 1
    assert verdict.counterexample.stream == "legacy"
    assert "legacy default stream (handle 0" in verdict.summary()


def test_the_memo_passed_while_every_call_ran_on_a_pool_stream(gelu, monkeypatch):
    """What the stream kind adds: with every call on a stream of its own the memo never engages."""
    every_call_on_a_pool_stream(monkeypatch)
    kernel = fakes.MemoOnDefaultStreams(gelu)
    verdict = run_verification(gelu, kernel, SMALL, device="cpu")
    assert verdict.passed and kernel.skipped == 0, verdict.summary()


def test_a_memo_on_cuda_stream_per_thread_only_is_rejected_too(gelu, monkeypatch):
    monkeypatch.setattr(fakes, "DEFAULT_STREAM_HANDLES", (2,))
    kernel = fakes.MemoOnDefaultStreams(gelu)
    verdict = run_verification(gelu, kernel, SMALL, device="cpu")
    assert not verdict.passed and kernel.skipped >= 1, verdict.summary()
    assert verdict.counterexample.stream == "per_thread", verdict.summary()


def test_a_stand_in_sees_the_handle_a_gpu_call_of_its_kind_gets():
    assert CpuStream.of("legacy").cuda_stream == 0
    assert CpuStream.of("per_thread").cuda_stream == 2  # cudaStreamPerThread
    assert CpuStream.of("pool").cuda_stream not in fakes.DEFAULT_STREAM_HANDLES
    with pytest.raises(ValueError):
        CpuStream.of("default")


def test_the_candidates_process_is_told_the_stream_kind_of_calls_and_timed_calls():
    runner = object.__new__(IsolatedRunner)  # no process: the requests are recorded
    sent = []
    runner._request = lambda message, timeout=None: sent.append(message) or Outcome()
    runner.scramble_workspace = lambda: None
    runner.with_workspace = lambda refs: refs
    runner.timed_item = lambda item: item
    runner.call_timeout = 45.0
    runner.call("forward", {}, {}, {"N": 1}, stream="legacy")
    runner.call("forward", {}, {}, {"N": 1})
    runner.timed([{"direction": "forward", "tensors": {}}], stream="per_thread")
    assert [m.get("stream") for m in sent] == ["legacy", "pool", "per_thread"]


def test_an_unknown_stream_kind_is_refused_before_any_cuda_call():
    from specgen.verify.graphs import STREAM_KINDS, stream_of_kind

    assert STREAM_KINDS == ("pool", "legacy", "per_thread")
    pool = object()
    assert stream_of_kind("pool", pool) is pool
    with pytest.raises(ValueError):
        stream_of_kind("legacy_default", pool)


# ------------------------------------------------------------------ the size function before every call

def test_a_kernel_that_counts_calls_right_after_a_size_query_is_rejected(gelu):
    """add_rmsnorm_size_cadence: wrong from the 4th call in a row that follows a question about its
    own arguments, the package's pattern, which the verifier now makes on every call."""
    kernel = fakes.SizeQueryCadence(gelu)
    verdict = run_verification(gelu, kernel, SMALL, device="cpu")
    assert not verdict.passed, verdict.summary()
    # (nondeterministic since version 8: the first calls come before the smoke case's two runs and
    # bring the 4th paired call into them)
    assert verdict.reason in ("wrong-result", "post-timing-mismatch", "nondeterministic"), verdict.summary()
    assert kernel.longest >= 4 and kernel.cheated >= 1


def test_the_cadence_passed_while_the_size_function_was_asked_once_per_case(gelu, monkeypatch):
    """What the per-call question adds: asked only when a case is staged, no call in a row pairs
    with more than one question, and the cheat never engages."""
    from specgen.verify import engine

    monkeypatch.setattr(LocalRunner, "_as_sized", lambda self, direction, tensors, scalars, dims: tensors)
    # (the calls from two threads ask the size function in their own driver: not this path)
    monkeypatch.setattr(engine, "check_calls_from_threads", lambda *a, **k: None)
    kernel = fakes.SizeQueryCadence(gelu)
    verdict = run_verification(gelu, kernel, SMALL, device="cpu")
    assert verdict.passed, verdict.summary()
    # at most 3 in a row (the call on fewer rows, the call on more rows right after it, then the
    # model's loop's first call: each staged right before), short of the 4 the cheat needs
    assert kernel.longest <= 3 and kernel.cheated == 0


def test_an_honest_kernel_gets_its_answer_as_workspace_bytes_on_every_call(gelu):
    kernel = fakes.WorkspaceKernel(gelu, fakes.gelu_via_workspace, lambda dims: 4 * dims["N"] * dims["D"])
    asked = []
    size = kernel.workspace_bytes
    kernel.workspace_bytes = lambda *args: asked.append(size(*args)) or asked[-1]
    verdict = run_verification(gelu, kernel, Options(examples=4, budget=1 << 13, seed=1, endurance=0), device="cpu")
    assert verdict.passed, verdict.summary()
    forward = [seen for seen in kernel.seen if seen[0] == "forward"]
    assert all(given == wanted for _, wanted, given, _ in forward)  # exactly the answer, as attach_workspace
    assert len(asked) > len(kernel.seen)  # once per call, and once per staged call beforehand


def test_a_size_function_that_asks_more_at_the_call_than_when_staged_is_bad_workspace(gelu):
    kernel = fakes.GrowingSize(gelu)
    verdict = run_verification(gelu, kernel, SMALL, device="cpu")
    assert verdict.reason == "bad-workspace", verdict.summary()
    assert "gelu_tanh_forward_workspace asked for" in verdict.detail and "right before a call" in verdict.detail
    assert not kernel.seen  # refused before the kernel ran


# ------------------------------------------------------------------ the compiled path: KernelLibrary.launcher

STUB = r"""
#include "gelu_tanh_abi.h"
size_t answer = 64;
int asked = 0, called = 0, paired = 0;
int64_t bytes_when_asked = -1, bytes_when_called = -1;
void* workspace_when_called = 0;
void* stream_when_called = (void*)1;
static const gelu_tanh_args* last_asked = 0;
size_t gelu_tanh_forward_workspace(const gelu_tanh_args* a) {
  asked++;
  last_asked = a;
  bytes_when_asked = a->workspace_bytes;
  return answer;
}
cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  called++;
  if (last_asked == a) paired++;
  last_asked = 0;
  bytes_when_called = a->workspace_bytes;
  workspace_when_called = a->workspace;
  stream_when_called = (void*)stream;
  return cudaSuccess;
}
"""


@pytest.fixture
def stub(tmp_path, gelu):
    """gelu_tanh's forward entry point and size function in C, host only (no GPU)."""
    from specgen.toolchain.cuda import find_cuda_toolkit

    try:
        include = find_cuda_toolkit().include_dir
    except Exception:  # noqa: BLE001 - no toolkit: nothing to compile against
        include = None
    if shutil.which("gcc") is None or include is None:
        pytest.skip("needs gcc and the CUDA headers")
    abi.write_header(gelu, tmp_path)
    (tmp_path / "stub.c").write_text(STUB)
    library = tmp_path / "libstub.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "stub.c"), f"-I{tmp_path}",
                    f"-I{include}"], check=True)
    from specgen.verify.library import KernelLibrary

    lib = KernelLibrary(gelu, library)
    import ctypes

    def value(name, kind=ctypes.c_int):
        return kind.in_dll(lib.lib, name).value
    return lib, value


def test_the_launcher_asks_the_size_function_right_before_each_call(stub):
    import ctypes

    lib, value = stub
    x, out = torch.zeros(3, 5), torch.zeros(3, 5)
    placed = torch.zeros(256, dtype=torch.uint8)
    launch = lib.launcher("forward", {"x": x, "out": out, abi.WORKSPACE: placed}, {}, {"N": 3, "D": 5},
                          types.SimpleNamespace(cuda_stream=0))
    assert value("asked") == 0  # packing asks nothing: the question belongs to the launch
    for n in (1, 2, 3, 4):
        assert launch() == 0
        assert value("asked") == n and value("called") == n and value("paired") == n
    assert value("bytes_when_asked", ctypes.c_int64) == 0  # the struct's workspace fields empty, as `args{}`
    assert value("bytes_when_called", ctypes.c_int64) == 64  # the answer, not the 256 placed
    assert value("workspace_when_called", ctypes.c_void_p) == placed.data_ptr()
    assert value("stream_when_called", ctypes.c_void_p) is None  # handle 0: the legacy default stream


def test_an_answer_of_zero_hands_no_workspace(stub):
    import ctypes

    lib, value = stub
    ctypes.c_size_t.in_dll(lib.lib, "answer").value = 0
    x, out = torch.zeros(2, 2), torch.zeros(2, 2)
    launch = lib.launcher("forward", {"x": x, "out": out, abi.WORKSPACE: torch.zeros(64, dtype=torch.uint8)}, {},
                          {"N": 2, "D": 2}, types.SimpleNamespace(cuda_stream=2))
    assert launch() == 0
    assert value("bytes_when_called", ctypes.c_int64) == 0 and value("workspace_when_called", ctypes.c_void_p) is None
    assert value("stream_when_called", ctypes.c_void_p) == 2  # cudaStreamPerThread


def test_an_answer_above_the_placed_workspace_is_not_called_and_named(stub):
    import ctypes

    from specgen.verify.library import WORKSPACE_SHORT

    lib, value = stub
    ctypes.c_size_t.in_dll(lib.lib, "answer").value = 4096
    x, out = torch.zeros(2, 2), torch.zeros(2, 2)
    launch = lib.launcher("forward", {"x": x, "out": out, abi.WORKSPACE: torch.zeros(1024, dtype=torch.uint8)}, {},
                          {"N": 2, "D": 2}, types.SimpleNamespace(cuda_stream=0))
    assert launch() == WORKSPACE_SHORT and value("asked") == 1 and value("called") == 0
    assert "asked for 4096 bytes of workspace right before a call, more than the 1024 bytes placed" in \
        lib.error_name(WORKSPACE_SHORT)
    launch = lib.launcher("forward", {"x": x, "out": out}, {}, {"N": 2, "D": 2}, types.SimpleNamespace(cuda_stream=0))
    assert launch() == WORKSPACE_SHORT and "more than the 0 bytes placed" in lib.error_name(WORKSPACE_SHORT)
