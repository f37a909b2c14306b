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

A forward beside a backward (verifier version 10): for a spec with a backward kernel, the backward's
checks also run pairs where one thread calls the forward and the other the backward, each on its
own inputs, outputs and workspace and checked against its own truth (`direction_pairs`). Entry
points that share host state between the directions (held-out attacks-v8's swiglu: each stores
"the kernel to launch" in one `static` a shared launcher reads, so a forward beside a backward
launches the other direction's kernel) pass every pair of one direction. A training process calls
both at once: a pipeline-parallel schedule runs one micro-batch's forward beside another's
backward from stage threads, and a trainer thread's backward runs beside a serving or rollout
thread's forward.

The threads' floating-point environment (verifier version 10): every thread reads its own before
its first call and after each call (the native driver MXCSR and the x87 control word, or FPCR;
Python threads through candidate_main.fp_state) and a change is reported (host-state-changed), as
the candidate's main thread's is after every request (candidate_main.fp_report).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from .. import abi
from .checks import check_close, check_same_bits
from .data import CaseData, asked_workspace, bind_inputs, place_inputs, place_workspaces, staged_calls
from .layout import Layout, TensorRef, shape_bytes
from .runner import check_guards, fill_outputs, raise_outcome, run_once, synchronize
from .strategies import Case
from .verdict import Failure

THREAD_CALLS = 200  # calls each thread makes in a row (about 1 ms of host time on a GPU)
RECORD_BYTES = 64 << 20  # output bytes per thread kept call by call (the large case's calls share sets in turn)
SEED_OFFSET = 5000  # the pairs' values: other draws than every other check's
DIRECTIONS_SEED_OFFSET = 5100  # the forward-beside-backward pairs' values
FORWARD_BESIDE_BACKWARD = True  # the pairs of a forward and a backward (a switch for the tests)

THREADS_HINT = ("called from host threads at the same time ({call}, {other} called from the other threads "
                "meanwhile, as a multi-threaded server or nn.DataParallel calls an op: the threads run the kernel's "
                "host code at once, so state kept in host memory between calls, e.g. a launch plan with the "
                "pointers in a `static` struct, a record per stream handle, or buffers for two callers, is shared "
                "and one call launches with another's arguments. Keep everything a call needs on the stack of the "
                "call), ")
DIRECTIONS_HINT = ("called from two host threads at the same time, a forward beside a backward ({call}, while "
                   "{other} meanwhile, as a pipeline-parallel schedule runs one micro-batch's forward beside "
                   "another's backward from two stage threads, or a trainer thread's backward runs beside a serving "
                   "thread's forward: both entry points' host code runs at once, so host state the two directions "
                   "share, e.g. which kernel a shared launcher starts kept in a `static`, is set by one and read by "
                   "the other. Keep everything a call needs on the stack of the call), ")


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

// The calling thread's floating-point environment, control bits only (candidate_main.fp_state):
// kind 1, x86-64: MXCSR without its sticky flags, the x87 control word above it; kind 2, aarch64:
// FPCR; kind 0: not read here.
#if defined(__x86_64__)
static const int kFpKind = 1;
static inline uint64_t fp_env() {
  uint32_t csr = 0;
  uint16_t cw = 0;
  __asm__ __volatile__("stmxcsr %0" : "=m"(csr));
  __asm__ __volatile__("fnstcw %0" : "=m"(cw));
  return (static_cast<uint64_t>(cw & 0x1F3Fu) << 32) | (csr & 0xFFC0u);
}
#elif defined(__aarch64__)
static const int kFpKind = 2;
static inline uint64_t fp_env() {
  uint64_t fpcr = 0;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  return fpcr & 0xFFFFFFFFu;
}
#else
static const int kFpKind = 0;
static inline uint64_t fp_env() { return 0; }
#endif

// Per thread of the last run: its environment before its first call, after the first call that
// left it changed, and that call's index (-1: none did).
static Job* g_jobs = nullptr;
static int64_t g_fp_before[64], g_fp_after[64], g_fp_call[64];

static inline void watch_fp(int64_t me, int64_t k) {
  if (g_fp_call[me] < 0) {
    const uint64_t now = fp_env();
    if (now != static_cast<uint64_t>(g_fp_before[me])) {
      g_fp_after[me] = static_cast<int64_t>(now);
      g_fp_call[me] = k;
    }
  }
}

static void* run(void* raw) {
  Job* job = static_cast<Job*>(raw);
  const int64_t me = job - g_jobs;
  g_arrived.fetch_add(1);
  while (g_arrived.load() < g_expected) {
  }
  g_fp_before[me] = g_fp_after[me] = static_cast<int64_t>(fp_env());
  for (int64_t k = 0; k < job->repeat; ++k) {
    char* args = static_cast<char*>(job->args[k % job->count]);
    if (job->size) {
      *reinterpret_cast<void**>(args + job->workspace_at) = nullptr;
      *reinterpret_cast<uint64_t*>(args + job->bytes_at) = 0;
      uint64_t asked = job->size(args);
      if (asked > job->have) {
        watch_fp(me, k);
        job->code = -7001;  // library.WORKSPACE_SHORT
        job->failed_call = static_cast<int32_t>(k);
        job->asked = asked;
        return nullptr;
      }
      *reinterpret_cast<void**>(args + job->workspace_at) = asked ? job->placed : nullptr;
      *reinterpret_cast<uint64_t*>(args + job->bytes_at) = asked;
    }
    int code = job->entry(args, job->stream);
    watch_fp(me, k);
    if (code) {
      job->code = code;
      job->failed_call = static_cast<int32_t>(k);
      return nullptr;
    }
  }
  return nullptr;
}

// What thread `index` of the last run saw (candidate_main.native_fp_reports): out[0] its
// environment before its calls, out[1] after the call out[2] (-1: unchanged). Returns kFpKind.
extern "C" int specgen_thread_fp_env(int index, int64_t* out) {
  if (index < 0 || index >= 64) return 0;
  out[0] = g_fp_before[index];
  out[1] = g_fp_after[index];
  out[2] = g_fp_call[index];
  return kFpKind;
}

extern "C" int specgen_call_from_threads(Job* jobs, int count) {
  if (count < 1 || count > 64) return -1;
  pthread_t threads[64];
  g_jobs = jobs;
  for (int i = 0; i < count; ++i) g_fp_call[i] = -1;
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


FRESH_SEED_OFFSET = 5200  # the fresh pairs' values
# Row widths of the fresh pairs' "wide" pair: both past 48 KiB of float32 (the dynamic shared memory a
# kernel must opt in to) and within what one H100/H200 block can stage (227 KiB), different from
# each other, odd (no other case's sizes), so each thread's call needs its own opt-in.
FRESH_WIDE_ROWS = (49151, 20483)
FRESH_ROWS = 3  # the other dims of the fresh pairs' cases (within their ranges)


def fresh_pairs(spec, seed: int, budget: int) -> list[tuple[Case, Case]]:
    """Pairs of cases that no earlier call of the process has used, called from two threads with no
    call alone first (check_calls_from_threads(fresh=True)): one new shape on both threads (server
    threads meeting the same new batch size at once: a host plan cache that publishes an entry's
    key before its fields are written, held-out attacks-v9's rope, session 34), and two wide rows
    of different widths (each call opting its kernel in to its own row's shared memory right before
    launching: one thread lowers the limit between the other's opt-in and launch, attacks-v9's
    softmax). Sizes within the ranges and the budget; the wide pair only where the row's range
    reaches past FRESH_WIDE_ROWS[1]."""
    from .strategies import fit_budget, legal_sizes, make_case, row_symbol

    sig = spec.signature
    steps = sig.symbol_divisors()
    symbols = sig.symbols()
    row = row_symbol(sig)

    def case(width: int | None, number: int) -> Case:
        wanted = {s: (width if s == row and width else FRESH_ROWS + 2 * number) for s in symbols}
        dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [wanted[s]])[0] for s in symbols}
        dims = fit_budget(sig, dims, spec.dims, budget, keep=row)
        return make_case(dims, spec.dtypes[0], seed=seed + FRESH_SEED_OFFSET + number)

    same = case(257 + 2 * FRESH_ROWS, 0)  # an odd width near the mid shape's: a new shape
    pairs = [(same, dataclasses.replace(same, seed=same.seed + 1))]
    if row is not None and spec.dims[row][1] > FRESH_WIDE_ROWS[1]:
        wide, narrower = case(FRESH_WIDE_ROWS[0], 1), case(FRESH_WIDE_ROWS[1], 2)
        if wide.dim_map != narrower.dim_map:
            pairs.append((wide, narrower))
    return pairs


def direction_pairs(big: Case, launch_bound: list[Case]) -> list[tuple[tuple[Case, str], tuple[Case, str]]]:
    """The pairs of a forward and a backward called from two threads at the same time: the forward
    on the large case beside the backward on the first launch-bound one, the backward on the large
    case (in the first thread) beside the forward on the first launch-bound one, and both on that
    one shape on values of their own."""
    small = launch_bound[0]
    pairs = [((big, "forward"), (small, "backward")), ((big, "backward"), (small, "forward")),
             ((small, "forward"), (small, "backward"))]
    return [((dataclasses.replace(a, seed=a.seed + DIRECTIONS_SEED_OFFSET + 2 * k), one),
             (dataclasses.replace(b, seed=b.seed + DIRECTIONS_SEED_OFFSET + 2 * k + 1), other))
            for k, ((a, one), (b, other)) in enumerate(pairs)]


GROUP_SEED_OFFSET = 5300  # the groups' values
GROUP_THREADS = 3  # more than two at once: a pool of two host buffers "for the model's thread and autograd's"
# every thread its own stream, then one handle for all: the legacy default stream. Not
# cudaStreamPerThread: three threads on it hung two honest controls (attacks-v11's softmax_b and
# add_rmsnorm_c, no answer in 45 s) on an H100 in session 42, cause not found (a limit, VERIFIER.md)
GROUP_STREAMS = ("pool", "legacy")


def thread_groups(launch_bound: list[Case], direction: str) -> list[tuple[tuple, str]]:
    """Three threads at once on the first launch-bound case (each on values of its own), first
    each on a stream of its own, then all on the legacy default stream (handle 0), as the threads
    of a program that never makes a stream call an op (verifier version 15): host state kept per
    stream handle ("one stream's calls run in order") is then shared by threads, and host buffers
    sized for two callers meet a third (held-out attacks-v11's log_softmax and swiglu).
    As ((case, direction), ...), stream kind."""
    small = launch_bound[0]
    calls = tuple((dataclasses.replace(small, seed=small.seed + GROUP_SEED_OFFSET + k), direction)
                  for k in range(GROUP_THREADS))
    return [(calls, kind) for kind in GROUP_STREAMS]


def thread_calls(big: Case, launch_bound: list[Case], direction: str, forward_too: bool = True
                 ) -> list[tuple[tuple[Case, str], tuple[Case, str]]]:
    """What two threads call at the same time in `direction`'s checks, as ((case, direction),
    (case, direction)) pairs: thread_pairs in `direction`, then, in the backward's checks (the
    forward's were run before) with `forward_too` (the forward verified too), direction_pairs."""
    pairs = [((a, direction), (b, direction)) for a, b in thread_pairs(big, launch_bound)]
    if direction == "backward" and forward_too and FORWARD_BESIDE_BACKWARD:
        pairs += direction_pairs(big, launch_bound)
    return pairs


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
        one = sum(shape_bytes(slot.shape, slot.dtype) for slot in item.outputs)
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


STREAM_WORDS = {"pool": "", "legacy": " all on the legacy default stream (handle 0)",
                "per_thread": " all on cudaStreamPerThread (handle 2)"}


def check_calls_from_threads(runner, cases: list[CaseData], *, deterministic: bool,
                             repeat: int = THREAD_CALLS, driver: str | None = None, fresh: bool = False,
                             stream: str = "pool") -> None:
    """Each case called alone (its results, and its bits), then every case from a host thread of
    its own, `repeat` calls each, all at once: every call's outputs must be its own inputs'
    results (and, for a deterministic spec, the bits it gives alone). The cases may be of either
    direction (direction_pairs: a forward beside a backward). Stages the cases itself
    (stage_apart). The threads are native (`driver`, by default native_driver() on a GPU) or,
    without one, Python's; each on a stream of its own, or all on one handle (`stream`:
    graphs.thread_streams). `fresh` (fresh_pairs): the threads' calls come first, on shapes the
    process has not met, and each case is called alone after them (for its bits)."""
    sets = stage_apart(runner, cases, repeat)
    alone = [] if fresh else [solo_call(runner, data, mine) for data, mine in zip(cases, sets)]
    workspaces = runner.workspaces()
    items = [[{"direction": data.direction,
               "tensors": {**data.input_refs, **refs, **({abi.WORKSPACE: workspaces[i]} if workspaces else {})},
               "scalars": data.scalars, "dims": data.dims} for refs in mine]
             for i, (data, mine) in enumerate(zip(cases, sets))]
    for mine in sets:
        for refs in mine:
            fill_outputs(runner, refs, 1)
    synchronize(cases[0].device)
    mixed = len({data.direction for data in cases}) > 1
    if mixed:  # the threads named: which thread called which direction on which case
        both = "; ".join(f"thread {i + 1}: the {data.direction} on {data.case.describe()}"
                         for i, data in enumerate(cases))
        what = f"calls from {len(cases)} host threads at the same time{STREAM_WORDS[stream]}, a forward beside a " \
               f"backward ({both})"
    else:
        both = " and ".join(data.case.describe() for data in cases)
        what = f"calls from {len(cases)} host threads at the same time{STREAM_WORDS[stream]} ({both})"
    if driver is None and cases[0].device.type == "cuda":
        driver = native_driver()
    outcome = runner.threads(items, repeat, driver, stream)
    failed = cases[outcome.failed_call or 0]
    try:
        raise_outcome(runner.spec, failed, outcome, what=what)
    except Failure as failure:
        if what in failure.detail:
            raise
        thread = f", thread {(outcome.failed_call or 0) + 1}'s call" if outcome.failed_call is not None else ""
        raise Failure(failure.reason, f"{what}{thread}: {failure.detail}", failure.counterexample,
                      fatal=failure.fatal) from None
    check_guards(runner, failed, f"with {what}: ")
    if fresh:  # every set checked against the truth first, then each case alone into a set of its own
        kept = [[{name: runner.tensor(ref).clone() for name, ref in refs.items()} for refs in mine] for mine in sets]
        for data, mine in zip(cases, kept):
            for number, together in enumerate(mine):
                check_close(data, together, prefix=THREADS_HINT.format(
                    call=f"a call this thread made on a shape the process had not met (output set {number + 1})",
                    other=" and ".join(d.case.describe() for d in cases if d is not data)))
        alone = [solo_call(runner, data, mine) for data, mine in zip(cases, sets)]
        for mine, copies in zip(sets, kept):
            for refs, copy in zip(mine, copies):
                for name, ref in refs.items():
                    runner.tensor(ref).copy_(copy[name])
    for index, (data, mine, solo) in enumerate(zip(cases, sets, alone)):
        others = " and ".join(d.case.describe() for j, d in enumerate(cases) if j != index)
        for number, refs in enumerate(mine):
            together = {name: runner.tensor(ref) for name, ref in refs.items()}
            if all(torch.equal(together[name], solo[name]) for name in refs):
                continue
            together = {name: t.clone() for name, t in together.items()}
            last = number + len(mine) * ((repeat - 1 - number) // len(mine))  # the call that wrote this set last
            if mixed:
                prefix = DIRECTIONS_HINT.format(
                    call=f"thread {index + 1} calling the {data.direction}, its call {last + 1} of {repeat}",
                    other=" and ".join(f"thread {j + 1} called the {d.direction} on {d.case.describe()}"
                                       for j, d in enumerate(cases) if j != index))
            else:
                prefix = THREADS_HINT.format(call=f"call {last + 1} of {repeat} this thread made{STREAM_WORDS[stream]}",
                                             other=others)
            check_close(data, together, prefix=prefix)
            if deterministic:
                check_same_bits(data, solo, together, what=f"a call alone and the same call {prefix[:-2]}")


def solo_call(runner, data: CaseData, mine: list[dict[str, TensorRef]]) -> dict[str, torch.Tensor]:
    """`data` called once alone into its first output set, checked against its truth; its outputs
    (copies: the set is written again by the threads' calls or restored after)."""
    got = run_once(runner, data, 0, mine[0])
    check_close(data, got)
    return got
