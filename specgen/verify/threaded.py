"""Calls from two host threads at the same time (verifier version 8).

Every other check calls the kernel from one host thread. A server's worker threads, or
nn.DataParallel's one thread per device, call an op from several at once, and a kernel's host
code that keeps a launch plan (pointers, grid, dims) in one `static` struct between calls shares
it between them: one thread's launch uses the other's pointers (held-out rope, session 30). Here
two calls, each with its own inputs, outputs and workspace, of different shapes where the pair
has them, are made from two host threads, each `THREAD_CALLS` times in a row on a stream of its
own after both are released together. The threads are native ones (DRIVER_SOURCE, compiled by
the judge and loaded by the candidate's process). Python threads, though ctypes lets go of the
GIL inside the library, hardly ever meet there: a thread waiting for the GIL wakes after the
other's call has returned. Measured on the H200 (session 30) with two gelu kernels that keep
their plan in a static struct (tests/adversarial/host_plan_across_threads.cu and one without the
device query between plan and launch): of 1000 calls per thread, Python threads spoiled none,
native threads 0.2-7%; of the check's runs, Python threads caught 2 of 30, native threads 52 of
60; honest kernels, with and without a workspace, passed 60 of 60. Without a toolkit to build the
driver (CPU stand-ins), Python threads.

A launch that used the other thread's plan leaves its own outputs unwritten, and a later call
of the same thread writes them again: each call therefore writes an output set of its own (as
many as `RECORD_BYTES` holds, then in turn), pre-filled with random bytes, and every set is
checked against its thread's truth. With one set per thread (only the last call seen), native
threads caught 2 of 30 runs. A plan torn between two shapes writes past an output (the guard
bytes) or reads past an input (a fault in the candidate's process).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from .. import abi
from .checks import check_close, check_same_bits
from .data import CaseData, asked_workspace, bind_inputs, place_inputs, place_workspaces, staged_calls
from .layout import Layout, TensorRef
from .runner import check_guards, fill_outputs, raise_outcome, run_once, synchronize
from .strategies import Case

THREAD_CALLS = 200  # calls each thread makes in a row (about 1 ms of host time on a GPU)
RECORD_BYTES = 64 << 20  # output bytes per thread kept call by call (the large case's calls share sets in turn)
SEED_OFFSET = 5000  # the pairs' values: other draws than every other check's

THREADS_HINT = ("called from two host threads at the same time ({call}, {other} called from the other thread "
                "meanwhile, as a multi-threaded server or nn.DataParallel calls an op: both threads run the kernel's "
                "host code at once, so state kept in host memory between calls, e.g. a launch plan with the "
                "pointers in a `static` struct, is shared by both and one call launches with the other's "
                "arguments. Keep everything a call needs on the stack of the call), ")


# The native threads (graphs.call_from_native_threads): loaded by the candidate's process next to
# the kernel's library, it calls the kernel's entry point from one pthread per caller, each `repeat`
# calls in a row through its own argument structs (the size function asked before each, as the
# package's binding asks), all released together by a spin barrier. Host code only, no CUDA call:
# a new thread's current device is device 0, the only device the candidate's process sees. Kept
# here as text (a package carries its .py files), compiled as a kernel is, cached by content.
DRIVER_SOURCE = r"""
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <atomic>

typedef int (*entry_fn)(const void*, void*);
typedef size_t (*size_fn)(const void*);

// What one thread calls; the layout matches graphs._NativeJob.
struct Job {
  entry_fn entry;
  size_fn size;           // the size function, asked right before each call as the package's binding asks
  void** args;            // the argument structs, called in turn
  int64_t count;
  void* stream;
  int64_t repeat;
  int64_t workspace_at;   // byte offsets of the struct's `workspace` and `workspace_bytes` fields
  int64_t bytes_at;
  void* placed;           // the workspace placed for this thread, and its bytes
  uint64_t have;
  int32_t code;           // out: the first failing call's code, or 0
  int32_t failed_call;    // out: its index
  uint64_t asked;         // out: what the size function asked when it was more than `have`
};

static std::atomic<int> g_arrived;
static std::atomic<int> g_expected;

static void* run(void* raw) {
  Job* job = static_cast<Job*>(raw);
  g_arrived.fetch_add(1);
  while (g_arrived.load() < g_expected) {
  }
  for (int64_t k = 0; k < job->repeat; ++k) {
    char* args = static_cast<char*>(job->args[k % job->count]);
    if (job->size) {
      *reinterpret_cast<void**>(args + job->workspace_at) = nullptr;
      *reinterpret_cast<uint64_t*>(args + job->bytes_at) = 0;
      uint64_t asked = job->size(args);
      if (asked > job->have) {
        job->code = -7001;  // library.WORKSPACE_SHORT
        job->failed_call = static_cast<int32_t>(k);
        job->asked = asked;
        return nullptr;
      }
      *reinterpret_cast<void**>(args + job->workspace_at) = asked ? job->placed : nullptr;
      *reinterpret_cast<uint64_t*>(args + job->bytes_at) = asked;
    }
    int code = job->entry(args, job->stream);
    if (code) {
      job->code = code;
      job->failed_call = static_cast<int32_t>(k);
      return nullptr;
    }
  }
  return nullptr;
}

extern "C" int specgen_call_from_threads(Job* jobs, int count) {
  if (count < 1 || count > 64) return -1;
  pthread_t threads[64];
  g_arrived.store(0);
  g_expected.store(count);
  int started = 0;
  for (; started < count; ++started) {
    if (pthread_create(&threads[started], nullptr, run, &jobs[started]) != 0) break;
  }
  if (started < count) g_expected.store(started);  // the barrier lets the started ones go; reported below
  for (int i = 0; i < started; ++i) pthread_join(threads[i], nullptr);
  return started == count ? 0 : -2;
}
"""


@functools.lru_cache(maxsize=1)
def native_driver() -> str | None:
    """DRIVER_SOURCE compiled (cached by content, as a kernel is): the library the candidate's
    process calls a compiled kernel's threads from. None where it cannot be built (no toolkit):
    the calls then come from Python threads, which meet in the kernel's host code far less often."""
    from ..toolchain.compile import compile_kernel

    try:
        return str(compile_kernel(DRIVER_SOURCE, name="threads_driver", source_name="threads_driver.cu").library)
    except Exception:  # noqa: BLE001 - the check still runs, from Python threads
        return None


def thread_pairs(big: Case, launch_bound: list[Case]) -> list[tuple[Case, Case]]:
    """The pairs of cases two threads call at the same time: the large case beside the first
    launch-bound one (two plans as different as the check has), the last launch-bound case
    beside the first where they differ (every call recorded on both threads), and the first
    beside itself on other values (one shape, other pointers: a plan cached per shape)."""
    small = launch_bound[0]
    pairs = [(big, small)]
    if launch_bound[-1].dim_map != small.dim_map:
        pairs.append((launch_bound[-1], small))
    pairs.append((small, small))
    return [(dataclasses.replace(a, seed=a.seed + SEED_OFFSET), dataclasses.replace(b, seed=b.seed + SEED_OFFSET + 1))
            for a, b in pairs]


def stage_apart(runner, cases: list[CaseData], repeat: int = THREAD_CALLS) -> list[list[dict[str, TensorRef]]]:
    """Lay out cases of any shapes together (data.stage takes several input sets of one shape):
    each its own inputs, its own output sets (one per call, as many as RECORD_BYTES holds) and a
    workspace of its own (all of the largest size asked, as stage's spares). Returns each case's
    output sets; a case's `output_refs` is its first."""
    layout = Layout()
    for item in cases:
        place_inputs(layout, item)
    sets = []
    for item in cases:
        one = sum(_nbytes(slot.shape, slot.dtype) for slot in item.outputs)
        count = max(1, min(repeat, RECORD_BYTES // max(one, 1)))
        sets.append([{slot.name: layout.place("outputs", slot.shape, slot.dtype) for slot in item.outputs}
                     for _ in range(count)])
    runner.ensure({arena: layout.needed(arena) for arena in ("inputs", "outputs")})
    runner.memory.layout = layout
    # the size function asked about every call of each case (one request per case), the most placed
    # once per case
    asked = [asked_workspace(runner, *staged_calls([item], mine)) for item, mine in zip(cases, sets)]
    place_workspaces(runner, layout, max(asked), len(cases))
    runner.memory.arm_guards()
    for item, mine in zip(cases, sets):
        bind_inputs(runner, item)
        item.output_refs = mine[0]
        item.snapshots = {}
    return sets


def _nbytes(shape, dtype: torch.dtype) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count * torch.empty((), dtype=dtype).element_size()


def check_calls_from_threads(runner, cases: list[CaseData], *, deterministic: bool,
                             repeat: int = THREAD_CALLS, driver: str | None = None) -> None:
    """Each case called alone (its results, and its bits), then every case from a host thread of
    its own, `repeat` calls each, all at once: every call's outputs must be its own inputs'
    results (and, for a deterministic spec, the bits it gives alone). Stages the cases itself
    (stage_apart). The threads are native (`driver`, by default native_driver() on a GPU) or,
    without one, Python's."""
    sets = stage_apart(runner, cases, repeat)
    alone = []
    for data, mine in zip(cases, sets):
        alone.append(run_once(runner, data, 0, mine[0]))
        check_close(data, alone[-1])
    workspaces = runner.workspaces()
    items = [[{"direction": data.direction,
               "tensors": {**data.input_refs, **refs, **({abi.WORKSPACE: workspaces[i]} if workspaces else {})},
               "scalars": data.scalars, "dims": data.dims} for refs in mine]
             for i, (data, mine) in enumerate(zip(cases, sets))]
    for mine in sets:
        for refs in mine:
            fill_outputs(runner, refs, 1)
    synchronize(cases[0].device)
    both = " and ".join(data.case.describe() for data in cases)
    if driver is None and cases[0].device.type == "cuda":
        driver = native_driver()
    outcome = runner.threads(items, repeat, driver)
    failed = cases[outcome.failed_call or 0]
    raise_outcome(runner.spec, failed, outcome, what=f"calls from {len(cases)} host threads at the same time ({both})")
    check_guards(runner, failed, f"with calls from {len(cases)} host threads at the same time ({both}): ")
    for index, (data, mine, solo) in enumerate(zip(cases, sets, alone)):
        others = " and ".join(d.case.describe() for j, d in enumerate(cases) if j != index)
        for number, refs in enumerate(mine):
            together = {name: runner.tensor(ref) for name, ref in refs.items()}
            if all(torch.equal(together[name], solo[name]) for name in refs):
                continue
            together = {name: t.clone() for name, t in together.items()}
            last = number + len(mine) * ((repeat - 1 - number) // len(mine))  # the call that wrote this set last
            prefix = THREADS_HINT.format(call=f"call {last + 1} of {repeat} this thread made", other=others)
            check_close(data, together, prefix=prefix)
            if deterministic:
                check_same_bits(data, solo, together, what=f"a call alone and the same call {prefix[:-2]}")
