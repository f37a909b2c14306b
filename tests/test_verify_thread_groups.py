"""Three host threads at once, each on a stream of its own and then all on one stream handle (the
legacy default stream), verifier version 15: host state kept per stream
handle ("one stream's calls run in order") is shared by threads that never make a stream, and
host buffers sized for two callers meet a third (held-out attacks-v11's log_softmax and swiglu,
which version 14 passed on an H100, session 42). The nvcc tests run the native threads driver on
the CPU over host-only "kernels" (the CPU runner's tensors are host memory), whose CPU streams are
the handles a GPU call gets (each pool stream another address; the legacy 0, the per-thread 2)."""
from __future__ import annotations

import pytest

from host_only_kernels import compiled_library, scale_spec
from specgen.verify.data import prepare
from specgen.verify.isolation import CpuStream, LocalRunner
from specgen.verify.strategies import make_case
from specgen.verify.threaded import GROUP_STREAMS, GROUP_THREADS, check_calls_from_threads, thread_groups
from specgen.verify.verdict import Failure

# A launch record per stream handle, read and rewritten without a lock: right while one thread
# calls on a handle (each pool stream is another handle), wrong when threads share one.
PER_STREAM_RECORD = """\
#include <sched.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include "scale_abi.h"
struct Record { uintptr_t stream; const float* x; float* out; long n; double alpha; };
static Record records[8];
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  Record* r = &records[((uintptr_t)stream >> 8) % 8];  // "one stream's calls run in order": no lock
  r->stream = (uintptr_t)stream;
  r->x = (const float*)a->x.data; r->out = (float*)a->out.data; r->n = a->N * a->D; r->alpha = a->alpha;
  for (volatile int spin = 0; spin < 2000; ++spin) {}
  sched_yield();
  for (long i = 0; i < r->n; ++i) r->out[i] = (float)(r->x[i] * r->alpha);
  return cudaSuccess;
}
"""

# Two host buffers claimed by atomic flags, "at most the model's thread and autograd's": a third
# caller at once falls back to buffer 0 while its owner still uses it.
TWO_BUFFERS = """\
#include <sched.h>
#include <atomic>
#include <cuda_runtime.h>
#include "scale_abi.h"
struct Plan { const float* x; float* out; long n; double alpha; };
static Plan buffers[2];
static std::atomic<int> busy[2];
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  int k = 0;
  for (; k < 2; ++k) { int free_ = 0; if (busy[k].compare_exchange_strong(free_, 1)) break; }
  const bool owned = k < 2;
  Plan* p = &buffers[owned ? k : 0];
  p->x = (const float*)a->x.data; p->out = (float*)a->out.data; p->n = a->N * a->D; p->alpha = a->alpha;
  for (volatile int spin = 0; spin < 2000; ++spin) {}
  sched_yield();
  for (long i = 0; i < p->n; ++i) p->out[i] = (float)(p->x[i] * p->alpha);
  if (owned) busy[k].store(0);
  return cudaSuccess;
}
"""


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    return scale_spec(tmp_path_factory)


def scale_group(spec, threads: int):
    return [prepare(spec, make_case({"N": 16, "D": 64}, "float32", seed=40 + k), "forward", "cpu")
            for k in range(threads)]


def caught_within(runner, spec, threads: int, stream: str, tries: int = 3) -> Failure | None:
    """The first Failure of up to `tries` runs of the check (a race shows in most runs, not all)."""
    from specgen.verify.threaded import native_driver

    for _ in range(tries):
        try:
            check_calls_from_threads(runner, scale_group(spec, threads), deterministic=True,
                                     driver=native_driver(), stream=stream)
        except Failure as failure:
            return failure
    return None


def test_each_stream_kind_gives_the_threads_the_handles_a_gpu_would():
    assert len({int(CpuStream.of("pool", thread=k)) for k in range(3)}) == 3
    assert {int(CpuStream.of("legacy", thread=k)) for k in range(3)} == {0}
    assert {int(CpuStream.of("per_thread", thread=k)) for k in range(3)} == {2}


def test_the_groups_are_three_threads_on_each_stream_kind():
    from specgen.verify.strategies import Case

    small = Case(dims=(("N", 3), ("D", 37)), dtype="float32", seed=9)
    groups = thread_groups([small], "backward")
    assert [kind for _, kind in groups] == list(GROUP_STREAMS) == ["pool", "legacy"]
    for calls, _ in groups:
        assert len(calls) == GROUP_THREADS == 3 and {way for _, way in calls} == {"backward"}
        assert len({case.seed for case, _ in calls}) == 3 and {case.dims for case, _ in calls} == {small.dims}


@pytest.mark.nvcc
def test_a_record_per_stream_handle_is_caught_when_threads_share_the_handle(scale, tmp_path):
    runner = LocalRunner(scale, compiled_library(scale, PER_STREAM_RECORD, tmp_path), "cpu")
    assert caught_within(runner, scale, 3, "pool") is None  # each thread's own handle: right
    failure = caught_within(runner, scale, 3, "legacy")
    assert failure is not None, "a record per stream handle passed three threads on the legacy stream"
    assert failure.reason in ("wrong-result", "out-of-bounds"), failure.detail
    assert "all on the legacy default stream (handle 0)" in failure.detail


@pytest.mark.nvcc
def test_buffers_for_two_callers_are_caught_by_a_third(scale, tmp_path):
    runner = LocalRunner(scale, compiled_library(scale, TWO_BUFFERS, tmp_path), "cpu")
    assert caught_within(runner, scale, 2, "pool") is None  # two threads: each owns a buffer
    failure = caught_within(runner, scale, 3, "pool")
    assert failure is not None, "buffers for two callers passed three threads at once"
    assert failure.reason in ("wrong-result", "out-of-bounds"), failure.detail
    assert "called from host threads at the same time" in failure.detail
