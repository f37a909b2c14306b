"""The verification itself, run in the judge's process (the worker; it needs the GPU): per
direction, a smoke case, the CUDA-graph capture, the boundary cases and size sweeps,
Hypothesis cases (shrunk on failure), full-size cases at the benchmark shapes and the tops of
the dims ranges (with bit-identical repeats), and the timed phase, whose every output is
checked. The candidate itself runs in its own process (isolation.IsolatedRunner)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from hypothesis import HealthCheck, Phase, Verbosity, assume, given, settings
from hypothesis import seed as hypothesis_seed

from .. import abi
from ..reference import reference_failure
from . import DEFAULT_EXAMPLES  # Hypothesis cases per direction, on top of the boundary cases
from .checks import (AFTER_SMALLER_HINT, check_on_the_workspace_left, check_calls_side_by_side, check_capture, check_case,
                     check_deterministic_repeats, check_finished_on_its_stream, check_first_calls,
                     check_repeated_calls, check_stale_output_loop, run_first_calls)
from .bad_indices import check_out_of_range_indices, ranged_inputs
from .host_memory import host_leak_failure
from .new_addresses import check_heap_over_new_addresses
from .thread_exit import check_heap_over_threads
from .chained import check_backward_on_own_saved
from .starved import check_starved_calls
from .dirty_pool import check_dirty_pool_calls
from .refused_setup import check_refused_setup, refused_runner
from .slow_runtime import check_threads_on_a_slow_runtime, slow_runner
from .sampled_rows import check_sampled_rows
from .far_inputs import check_far_inputs
from .char_abi import check_unsigned_char, unsigned_char_runner
from .data import CaseData, prepare, stage
from .domain import reference_domain, refuses
from .threaded import STREAM_WORDS, check_calls_from_threads, fresh_pairs, thread_calls, thread_groups
from .strategies import (DEFAULT_BUDGET_ELEMENTS, Case, boundary_cases, case_strategy, classes_at_scale, scalars_at_scale,
                         fewer_rows_case, fit_budget, more_rows_case, fresh_case, full_size_cases, large_case, make_case,
                         one_row_case, row_symbol, smoke_case)
from .runner import check_guards, raise_outcome
from .verdict import CRASH, INPUT_MUTATED, NOT_CAPTURABLE, PASSED, Failure, Verdict

SHRINK_SECONDS = 20.0  # stop shrinking a counterexample after this long
TIMED_REPS, TIMED_WARMUP = 4, 2  # per benchmark shape and dtype: every call on input values never seen before
# once per direction, at the first benchmark shape: the benchmark's own cadence (bench.py's
# defaults), so a kernel that counts calls or watches the clock meets the benchmark here
BENCH_SETS, BENCH_REPS, BENCH_WARMUP = 3, 40, 5
SANITIZER_ELEMENTS = 1 << 22  # the sanitizer's large case: the benchmark shape scaled to this
CPU_PAST_INT32_ELEMENTS = 1 << 20  # the CPU stand-ins run the past-2^31 case only below this (tests lower the mark)
CPU_SAMPLED_ELEMENTS = 1 << 20  # ... and with its truth on sampled rows only below this (sampled_rows.py)
PAST_INT32_ALLOWANCE = 2.0  # the past-2^31 case is tried up to this many times the memory plan (past_int32)
# Calls of one small case in a row before the small checks run again: a kernel that misbehaves
# only after many calls in a process (a counter on the host or the device) meets a long run's
# worth (a third from the host, the rest as CUDA-graph replays). The CPU stand-ins make fewer.
ENDURANCE_CALLS, ENDURANCE_CPU_CALLS, ENDURANCE_GRAPH_CALLS = 120_000, 600, 1000
# The stream each check's calls run on (graphs.STREAM_KINDS): the package's binding passes
# getCurrentCUDAStream(), the legacy default stream (handle 0) in a program that never makes a
# stream, so the smoke case, the repeated calls and every call of a model's loop run there; the
# boundary cases and the full-size ones take the legacy stream, cudaStreamPerThread and a stream
# of their own in turn. The capture, the calls side by side, the copy after a call, the
# endurance run and the timed phase keep streams of their own (a capture cannot run on the
# legacy stream). The judge synchronizes around every request, so the legacy stream's
# synchronization with other blocking streams changes nothing.
SMOKE_STREAM = LOOP_STREAM = "legacy"
BOUNDARY_STREAMS = ("legacy", "pool", "per_thread")
FULL_SIZE_STREAMS = ("pool", "legacy", "per_thread")  # the first case, repeated and captured, on a pool stream


def boundary_stream(index: int) -> str:
    """The stream kind of the `index`-th boundary case: legacy, pool, per-thread in turn."""
    return BOUNDARY_STREAMS[index % len(BOUNDARY_STREAMS)]


def cadence_sets(fitting: int) -> int:
    """Input sets of the benchmark's cadence, when `fitting` sets of the shape fit in memory."""
    return max(1, min(BENCH_SETS, fitting))


@dataclass
class Options:
    examples: int = DEFAULT_EXAMPLES
    seed: int = 0
    budget: int = DEFAULT_BUDGET_ELEMENTS
    directions: tuple[str, ...] | None = None  # default: forward, and backward when the spec has a kernel
    quick: bool = False  # the small run for compute-sanitizer: smoke, a few boundary cases, one large case
    full_size: bool = True  # cases at the benchmark shapes and the tops of the ranges, and the timed phase
    endurance: int | None = None  # calls in a row before the checks run again (None: ENDURANCE_CALLS on a GPU)
    unsigned_char_library: str | None = None  # (version 16) the build with plain char unsigned (char_abi.py)


Progress = Callable[[str], None]


class Session:
    """The checks of one candidate, with the bookkeeping the verdict reports."""

    def __init__(self, spec, runner, options: Options, progress: Progress, device: str = "cuda",
                 writable_runner: Callable[[], object] | None = None,
                 waiting: Callable[[float], None] | None = None,
                 fresh_runner: Callable[[], object] | None = None):
        self.spec, self.runner, self.options, self.progress = spec, runner, options, progress
        self.waiting = waiting  # told the seconds spent waiting for the GPU lock (not the kernel's time)
        self.device = torch.device(device)
        self.writable_runner = writable_runner  # to tell a write to a read-only input from a crash
        self.fresh_runner = fresh_runner  # a process no call has run in yet (first_call_in_each_dtype)
        self.cases = 0
        self.tolerances: dict[str, dict] = {}
        self.timed: dict[str, float] = {}
        self.phases: dict[str, float] = {}  # seconds per phase, both directions together
        self._per_element: dict[tuple, float] = {}  # device bytes per case element (memory.py)
        self._separable: dict[tuple[str, str], bool] = {}  # (direction, symbol): rows computed alone (sampled_rows)
        self.shrunk: list[str] = []  # full-size work scaled to the GPU memory free at the time
        # value classes outside the reference's domain in a dtype (it raises on them): not drawn there
        self.domain = reference_domain(spec, progress)
        self.skipped: list[str] = []  # cases whose values the reference refused (the screen missed them)

    def prepare(self, case: Case, direction: str, lean: bool = False, later: bool = False) -> CaseData:
        self.progress(f"{direction}: {case.describe()}")
        return prepare(self.spec, case, direction, self.device, lean=lean, later=later)

    def stats(self, case: Case, direction: str, data: CaseData) -> dict:
        return self.tolerances.setdefault(f"{direction} {case.dtype}", {"spec_atol": data.spec_atol,
                                                                         "spec_rtol": data.rtol})

    def run_case(self, case: Case, direction: str, stream: str = "pool") -> dict:
        # only for a reference that refused some class in the screen: it checks values (a CPU run per case)
        if self.domain.rejected and case.distribution != "normal" and (problem := self.refused(case)):
            self.skipped.append(f"{case.describe()}: {problem}")
            return {}
        data = self.prepare(case, direction)
        stage(self.runner, data, snapshots=not self.runner.readonly_inputs)
        self.cases += 1
        try:
            return check_case(self.runner, data, deterministic=self.spec.deterministic,
                              stats=self.stats(case, direction, data), stream=stream)
        except Failure as failure:
            if failure.reason == CRASH and self.runner.readonly_inputs and self.writable_runner:
                self.explain_crash(case, direction, failure, stream)
            raise

    def refused(self, case: Case) -> str | None:
        """The reference's error on this case's values (drawn where the case draws them, run on
        CPU copies), or None: on the GPU a refusal is a device-side assert in this process."""
        from ..inputs import make_inputs

        args = make_inputs(self.spec.signature, case.dim_map, case.dtype, seed=case.seed, distribution=case.distribution,
                           overrides=dict(case.overrides),
                           scalars=dict(case.scalars), draw_on=self.device, device="cpu")
        return refuses(self.spec, args, case.dim_map, case.dtype)

    def explain_crash(self, case: Case, direction: str, crash: Failure, stream: str = "pool") -> None:
        """The inputs are mapped read-only for the candidate: run the case again with writable
        inputs; if the crash goes away, the kernel wrote to an input."""
        self.progress(f"{direction}: the kernel crashed; again with writable inputs")
        runner = self.writable_runner()
        try:
            data = prepare(self.spec, case, direction, self.device)
            stage(runner, data, snapshots=True)
            check_case(runner, data, deterministic=self.spec.deterministic, stream=stream)
        except Failure as failure:
            if failure.reason == INPUT_MUTATED:
                raise Failure(INPUT_MUTATED, failure.detail + " (with the inputs mapped read-only, the write "
                                                              "faulted)", failure.counterexample) from None
            raise crash from None
        finally:
            runner.close()
        raise Failure(INPUT_MUTATED, f"the kernel wrote to an input on {case.describe()} ({direction}): with the "
                                     f"inputs mapped read-only the write faulted ({crash.detail}); with writable "
                                     f"inputs it ran and left them as they were, so it restored what it wrote. "
                                     f"Inputs are read only, even for a moment: keep temporaries in your own "
                                     f"workspace or in the outputs", crash.counterexample)

    def domain_notes(self) -> list[str]:
        """What the verdict says of values the reference refused: classes not drawn, cases skipped."""
        notes = [self.domain.describe()] if self.domain.rejected else []
        if self.skipped:
            notes.append(f"{len(self.skipped)} case(s) skipped where the reference refused their values on the "
                         f"CPU, e.g. {self.skipped[0]}")
        return notes

    def phase(self, name: str, started: float) -> float:
        now = time.perf_counter()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - started, 3)
        return now

    def direction(self, direction: str) -> None:
        """Every check of one direction: the small cases sharing the GPU with other
        verifications (never with timing: gpulock), then the full-size cases and timed calls alone."""
        with self.gpu("shared"):
            quick = self.small_cases(direction)
        if self.options.full_size and not quick:
            with self.gpu("exclusive"):
                self.full_size(direction)
                if self.device.type == "cuda":
                    self.runner.shrink()  # leave the GPU's memory to the next holder (a failure ends
                    torch.cuda.empty_cache()  # the verification, and closing the runner frees it all)

    @contextlib.contextmanager
    def gpu(self, how: str):
        """The GPU lock (gpulock) for a block; no lock for the CPU stand-ins."""
        if self.device.type != "cuda":
            yield
            return
        from .gpulock import exclusive_gpu, shared_gpu

        take = exclusive_gpu if how == "exclusive" else shared_gpu
        with take(self.device.index or 0, self.progress, waiting=self.waiting) as waited:
            self.phases["waiting for the GPU"] = round(self.phases.get("waiting for the GPU", 0.0) + waited, 3)
            yield

    def small_cases(self, direction: str) -> bool:
        """First calls, smoke, capture, boundary, sweep, Hypothesis, repeated calls, calls side by side, calls
        from two host threads; True for a quick run (the sanitizer's), which ends here."""
        spec, opts = self.spec, self.options
        t = time.perf_counter()
        smoke = smoke_case(spec, opts.seed)
        if not opts.quick:  # the direction's first calls in this process: one on a busy stream, one racing it
            self.progress(f"{direction}: the first calls, on a busy stream and on another")
            pair = [self.prepare(dataclasses.replace(smoke, seed=smoke.seed + 5000 + i), direction) for i in (0, 1)]
            copies = stage(self.runner, pair, snapshots=False, output_copies=2, workspaces=2)
            first = run_first_calls(self.runner, pair, copies)
            self.cases += 2
        self.run_case(smoke, direction, SMOKE_STREAM)
        if not opts.quick:
            check_first_calls(pair, first)
            del pair, first
            # indices outside their declared range (a padding label): no fault, no write outside (bad_indices.py)
            if ranged_inputs(spec, smoke.dim_map):  # prepared only where there is an index to plant
                self.progress(f"{direction}: indices outside their declared range")
                bad = self.prepare(dataclasses.replace(smoke, seed=smoke.seed + 7000), direction)
                stage(self.runner, bad, snapshots=False)
                self.cases += check_out_of_range_indices(self.runner, bad)
                del bad
            # no GPU memory left to allocate: an unchecked cudaMallocAsync faults; at the smoke shape, the
            # widest row and many rows, each followed by normal calls that must finish (starved.py, version 16)
            self.cases += check_starved_calls(self, direction, smoke, SMOKE_STREAM)  # the same thread's calls
            # cudaMallocAsync scratch that other users of the default pool left dirty (dirty_pool.py, version 16)
            self.cases += check_dirty_pool_calls(self, direction, SMOKE_STREAM)
        self.progress(f"{direction}: CUDA graph capture")
        self.capture(smoke, direction, later_sets=2)
        if not opts.quick:
            self.capture_few_rows(direction)
            self.first_call_in_each_dtype(direction)
            check_refused_setup(self, direction)  # (version 16) the set-aside refused, as under MPS (refused_setup.py)
        t = self.phase("smoke+capture", t)
        if not opts.quick:  # (version 16) tensors 9-17 GiB apart (far_inputs.py); plain char unsigned (char_abi.py)
            check_far_inputs(self, direction)
            check_unsigned_char(self, direction)
            t = self.phase("far-inputs+unsigned-char", t)
        boundary = boundary_cases(spec, opts.budget, opts.seed, self.domain)
        for index, case in enumerate(boundary[:4] if opts.quick else boundary):
            self.run_case(case, direction, boundary_stream(index))
        t = self.phase("boundary+sweep", t)
        if opts.quick:
            self.run_case(self.sanitizer_case(), direction)
            return True
        if direction == "backward":  # on the outputs and saved values its own forward wrote (verify/chained.py)
            self.cases += check_backward_on_own_saved(spec, self.runner, self.device, seed=opts.seed + 6000,
                                                      budget=opts.budget, progress=self.progress,
                                                      stats=lambda case, data: self.stats(case, "backward", data))
            t = self.phase("own-saved", t)
        self.hypothesis(direction)
        t = self.phase("hypothesis", t)
        big = large_case(spec, opts.budget, opts.seed + 7)
        self.progress(f"{direction}: repeated calls on the same buffers, {big.describe()}")
        data = self.prepare(big, direction)
        stage(self.runner, data, snapshots=not self.runner.readonly_inputs)
        fresh = self.prepare(fresh_case(big, big.seed + 1000, self.domain), direction)
        check_repeated_calls(self.runner, data, fresh, stream=LOOP_STREAM)
        del fresh
        if (fewer := fewer_rows_case(spec, big)) is not None:  # the workspace as the last call on `big` left it
            self.progress(f"{direction}: fewer rows right after, on the same workspace, {fewer.describe()}")
            smaller = self.prepare(fewer, direction)
            stage(self.runner, smaller, snapshots=False)
            check_on_the_workspace_left(self.runner, smaller, stream=LOOP_STREAM)
            del smaller
            self.cases += 1
        if (more := more_rows_case(spec, big)) is not None:  # on the workspace the call on fewer rows left
            self.progress(f"{direction}: more rows right after fewer, on the same workspace, {more.describe()}")
            larger = self.prepare(dataclasses.replace(more, seed=big.seed + 3000), direction)
            stage(self.runner, larger, snapshots=False)
            check_on_the_workspace_left(self.runner, larger, stream=LOOP_STREAM, hint=AFTER_SMALLER_HINT)
            del larger
            self.cases += 1
        for number, looped in enumerate([big, *self.launch_bound_cases()]):
            self.progress(f"{direction}: a model's loop (output kept between calls), then a few inputs changed, "
                          f"{looped.describe()}")
            loop = prepare(self.spec, dataclasses.replace(looped, seed=looped.seed + 2000), direction, self.device,
                           later=True)
            stage(self.runner, loop, snapshots=False)
            check_stale_output_loop(self.runner, loop, seed=opts.seed + number, stream=LOOP_STREAM)
            self.cases += 2
        t = self.phase("repeated-calls", t)
        for paired in [big, *self.launch_bound_cases()]:
            self.progress(f"{direction}: two calls at the same time on two streams, {paired.describe()}")
            pair = [prepare(self.spec, dataclasses.replace(paired, seed=paired.seed + 3000 + i), direction, self.device)
                    for i in (0, 1)]
            copies = stage(self.runner, pair, snapshots=False, output_copies=2, workspaces=2)
            check_calls_side_by_side(self.runner, pair, copies, deterministic=spec.deterministic)
            self.cases += 2
            self.progress(f"{direction}: a copy of the outputs on the call's stream, {paired.describe()}")
            once = prepare(self.spec, dataclasses.replace(paired, seed=paired.seed + 4000), direction, self.device)
            copies = stage(self.runner, once, snapshots=False, output_copies=2)
            check_finished_on_its_stream(self.runner, once, copies)
            self.cases += 1
        t = self.phase("side-by-side", t)
        for pair in thread_calls(big, self.launch_bound_cases(), direction,  # (a forward beside a backward too)
                                 forward_too="forward" in (opts.directions or ("forward",))):
            self.progress(f"{direction}: calls from two host threads at the same time, "
                          + " and ".join(f"{way} {case.describe()}" for case, way in pair))
            threaded = [prepare(self.spec, case, way, self.device) for case, way in pair]
            check_calls_from_threads(self.runner, threaded, deterministic=spec.deterministic)
            self.cases += 2
        for group, kind in thread_groups(self.launch_bound_cases(), direction):  # three at once, own or one stream
            self.progress(f"{direction}: calls from {len(group)} host threads at the same time{STREAM_WORDS[kind]}, "
                          f"{group[0][0].describe()}")
            threaded = [prepare(self.spec, case, way, self.device) for case, way in group]
            check_calls_from_threads(self.runner, threaded, deterministic=spec.deterministic, stream=kind)
            self.cases += len(group)
        check_threads_on_a_slow_runtime(self, direction)  # (version 16) four shapes at once, runtime slowed
        for pair in fresh_pairs(spec, opts.seed, opts.budget):  # shapes no call has met yet, no call alone first
            self.progress(f"{direction}: calls from two host threads at the same time on new shapes, "
                          + " and ".join(case.describe() for case in pair))
            threaded = [prepare(self.spec, case, direction, self.device) for case in pair]
            check_calls_from_threads(self.runner, threaded, deterministic=spec.deterministic, fresh=True)
            self.cases += 2
        t = self.phase("threads", t)
        self.endurance(direction, [(smoke_case(spec, opts.seed + 5), SMOKE_STREAM),
                                   *((case, boundary_stream(i)) for i, case in enumerate(boundary[:3])),
                                   (big, LOOP_STREAM)])
        self.phase("endurance", t)
        return False

    def capture_few_rows(self, direction: str) -> None:
        """CUDA graph capture at the launch-bound sizes a decode loop captures (the smallest
        benchmark shape, and one row of it): a schedule of its own for a few rows (split rows that
        read a flag back to the host mid-call) is never captured at the smoke or full-size case,
        and vLLM, SGLang and torch.compile's reduce-overhead capture their decode step for batch
        sizes 1, 2, 4, 8, 16 (version 13: held-out attacks-v10's softmax passed version 12)."""
        cases = self.launch_bound_cases()[1:]
        if (one := one_row_case(self.spec, cases[0] if cases else None, self.options.seed + 13)) is not None:
            cases.append(one)
        for case in cases:
            self.progress(f"{direction}: CUDA graph capture on {case.describe()}")
            self.capture(case, direction)
            self.cases += 1

    def capture(self, case: Case, direction: str, later_sets: int = 0) -> None:
        """`case` captured into a CUDA graph and replayed on fresh values (checks.check_capture),
        then on `later_sets` more input sets."""
        data = self.prepare(case, direction)
        stage(self.runner, data, snapshots=not self.runner.readonly_inputs)
        fresh = self.prepare(fresh_case(case, case.seed + 1, self.domain), direction)
        later = tuple(self.prepare(fresh_case(case, case.seed + k, self.domain), direction)
                      for k in range(2, 2 + later_sets))
        check_capture(self.runner, data, fresh, deterministic=self.spec.deterministic, later=later)

    def first_call_in_each_dtype(self, direction: str) -> None:
        """For each dtype but the first, a process of its own whose first call is in that dtype,
        then a call in every other dtype, each checked: every other process of the verification
        calls the first dtype first, and host code that fixes a choice at its first call (a
        function-local `static` set from the first call's dtype) is wrong only in a process that
        begins otherwise, as a bfloat16 model's process that later runs a float32 head does
        (version 13: held-out attacks-v10's GELU froze tanh.approx for every later float32 call)."""
        if self.fresh_runner is None or len(self.spec.dtypes) < 2:
            return
        smoke = smoke_case(self.spec, self.options.seed + 17)
        # the first call at the smoke shape, the others at the large case: an approximation keeps
        # within float32's tolerance on the smoke case's 1369 values (attacks-v10's GELU passed
        # there on the H200, session 38), its worst elements show among millions
        big = large_case(self.spec, self.options.budget, self.options.seed + 18)
        for first in self.spec.dtypes[1:]:
            order = [first, *(d for d in self.spec.dtypes if d != first)]
            self.progress(f"{direction}: a process whose first call is {first}, then {', '.join(order[1:])}")
            runner = self.fresh_runner()
            try:
                for number, dtype in enumerate(order):
                    case = smoke if number == 0 else big
                    data = self.prepare(dataclasses.replace(case, dtype=dtype), direction)
                    stage(runner, data, snapshots=False)
                    self.cases += 1
                    try:
                        check_case(runner, data, deterministic=self.spec.deterministic)
                    except Failure as failure:
                        raise Failure(failure.reason, f"in a process whose first call was {direction} in {first}: "
                                                      f"{failure.detail}", failure.counterexample,
                                      fatal=failure.fatal) from None
            finally:
                runner.close()

    def launch_bound_cases(self) -> list[Case]:
        """Small cases for the model-loop check besides the large one: a memo that only works at
        launch-bound sizes (where skipping the work pays and a table of results is cheap) never
        runs at the large case. The smoke case, and the smallest benchmark shape within the budget."""
        spec, seed = self.spec, self.options.seed
        cases = [smoke_case(spec, seed + 11)]
        if spec.benchmark:
            smallest = min(spec.benchmark, key=lambda shape: math.prod(int(v) for v in shape.values()))
            case = self.scaled(make_case({s: int(smallest[s]) for s in spec.signature.symbols()}, spec.dtypes[-1],
                                         seed=seed + 12))
            if case.dim_map != cases[0].dim_map:
                cases.append(case)
        return cases

    def endurance(self, direction: str, again: list[tuple[Case, str]]) -> None:
        """The kernel called as often as a long run calls it, then the cases `again` checked anew
        (each on its stream kind)."""
        default = ENDURANCE_CALLS if self.device.type == "cuda" else ENDURANCE_CPU_CALLS
        total = default if self.options.endurance is None else self.options.endurance
        if total <= 0:
            return
        small = smoke_case(self.spec, self.options.seed + 4)
        self.progress(f"{direction}: {total} calls in a row on {small.describe()}, then earlier cases again")
        data = self.prepare(small, direction)
        stage(self.runner, data, snapshots=False)
        graph_calls = min(ENDURANCE_GRAPH_CALLS, total)
        replays = (total - total // 3) // graph_calls
        outcome = self.runner.endure(direction, {**data.input_refs, **data.output_refs}, data.scalars, data.dims,
                                     host_calls=total - replays * graph_calls, graph_calls=graph_calls,
                                     replays=replays)
        what = f"{total} calls in a row on {small.describe()}"
        raise_outcome(self.spec, data, outcome, what=what)
        # (version 13) host memory the calls allocated and never freed (host_memory.py)
        if (leak := host_leak_failure(abi.entry_point(self.spec, direction), outcome.host_heap, what)) is not None:
            raise leak
        if not outcome.ok:
            raise Failure(NOT_CAPTURABLE, f"{what}: {graph_calls} calls could not be captured into one CUDA graph "
                                          f"({outcome.problem})")
        check_guards(self.runner, data, f"in {what}: ")
        # (version 16) the host heap over short-lived calling threads, then over calls at new addresses
        check_heap_over_threads(self, data)  # (thread_exit.py)
        check_heap_over_new_addresses(self, data)  # (new_addresses.py: stages `data` anew)
        for case, stream in again:
            try:
                self.run_case(case, direction, stream)
            except Failure as failure:
                raise Failure(failure.reason, f"after {what} (a long run's worth): {failure.detail}",
                              failure.counterexample, fatal=failure.fatal) from None

    def scaled(self, case: Case) -> Case:
        dims = fit_budget(self.spec.signature, case.dim_map, self.spec.dims, self.options.budget)
        return dataclasses.replace(case, dims=tuple(dims.items()))

    def sanitizer_case(self) -> Case:
        """The first benchmark shape (else the tops of the ranges) scaled to SANITIZER_ELEMENTS:
        above any size a kernel could branch on to misbehave, small enough for the sanitizer."""
        spec = self.spec
        dims = dict(spec.benchmark[0]) if spec.benchmark else {s: spec.dims[s][1] for s in spec.signature.symbols()}
        dims = fit_budget(spec.signature, {s: int(v) for s, v in dims.items()}, spec.dims, SANITIZER_ELEMENTS)
        return make_case(dims, spec.dtypes[0], seed=self.options.seed + 99)

    def full_size(self, direction: str) -> None:
        """Cases at real sizes, checked against the float64 truth computed on the GPU; repeats of
        the first for determinism; then the timed phase at every benchmark shape and dtype."""
        from .timed import judge_memory_of_inputs, timed_calls

        started = time.perf_counter()
        on_gpu = self.device.type == "cuda"
        cases = full_size_cases(self.spec, self.options.seed + 500)
        # value classes at the first benchmark shape; not for a reference that refused some class in
        # the screen (each of its cases is screened on the CPU first: too slow at full size, and a
        # refusal on the GPU is a device-side assert in the judge)
        if cases and not self.domain.rejected:
            cases += classes_at_scale(self.spec, cases[:len(self.spec.benchmark)], self.domain, self.options.seed + 600,
                                      backward=direction == "backward")
        if cases and self.spec.benchmark:
            cases += scalars_at_scale(self.spec, cases[0], self.domain, self.options.seed + 650)
        if not on_gpu:  # the CPU stand-ins of the unit tests: the same phases at small sizes
            cases = [self.scaled(case) for case in cases]
        for index, case in enumerate(cases):
            if on_gpu:  # the first case has a second set alive for the capture check
                case = self.fit_memory(case, direction, copies=2 if index == 0 else 1)
            data = self.prepare(case, direction)
            stage(self.runner, data, snapshots=False)
            self.cases += 1
            out = check_case(self.runner, data, deterministic=self.spec.deterministic,
                             stats=self.stats(case, direction, data),
                             stream=FULL_SIZE_STREAMS[index % len(FULL_SIZE_STREAMS)])
            if index == 0 and self.spec.deterministic:
                self.progress(f"{direction}: repeated runs on {case.describe()}")
                check_deterministic_repeats(self.runner, data, out)
            if index == 0:  # a kernel may sync or fork only above some size: capture at full size too
                self.progress(f"{direction}: CUDA graph capture on {case.describe()}")
                fresh = self.prepare(fresh_case(case, case.seed + 1, self.domain), direction)
                check_capture(self.runner, data, fresh, deterministic=self.spec.deterministic)
                del fresh
            del data, out
        started = self.phase("full-size", started)
        flush = _flush_bytes() if on_gpu else 0
        for number, (shape, dtype) in enumerate(timed_pairs(self.spec.benchmark, self.spec.dtypes)):
            base = make_case({s: int(shape[s]) for s in self.spec.signature.symbols()}, dtype,
                             seed=self.options.seed + 900)
            base = base if on_gpu else self.scaled(base)
            self.progress(f"{direction}: timed calls on {base.describe()}")
            calls = TIMED_REPS + TIMED_WARMUP
            count = self.timed_sets(base, direction, calls) if on_gpu else calls

            def fresh_run(first_seed: int, sets_count: int):  # every call on a new set (sets_count == calls)
                sets = [prepare(self.spec, self.timed_draw(base, first_seed + i, i), direction, self.device,
                                later=True) for i in range(sets_count)]
                timed = timed_calls(self.runner, self.spec, sets, reps=TIMED_REPS, warmup=TIMED_WARMUP,
                                    flush_bytes=flush, keep_truths=sets_count == calls)
                self.cases += timed.checked_calls
                return timed

            count, run = self.within_memory(base, direction, count, lambda n: fresh_run(base.seed, n))
            self.timed[f"{direction} {base.describe()}"] = round(run.median_us, 2)
            if number == 0:
                self.progress(f"{direction}: the benchmark's cadence on {base.describe()}")
                # no more sets than the fresh run could hold: at a 4.3 GB benchmark shape three sets
                # asked for a 48 GB arena beside the fresh run's and ran out of memory on the H200
                sets = [prepare(self.spec, dataclasses.replace(base, seed=base.seed + 50 + i), direction,
                                self.device, later=True) for i in range(cadence_sets(count))]
                repeated = timed_calls(self.runner, self.spec, sets, reps=BENCH_REPS, warmup=BENCH_WARMUP,
                                       flush_bytes=flush)
                self.cases += repeated.checked_calls
                del sets
                if on_gpu and count == calls:  # every call of `run` met a set never seen before
                    judge_memory_of_inputs(run, repeated, f"{base.describe()} ({direction})",
                                           lambda: fresh_run(base.seed + 2000, count))
        started = self.phase("timed", started)
        # last: their arenas would leave the timed phase fewer sets. Past 2^32 too since version 13:
        # offsets in unsigned 32-bit wrap there and pass at 2^31 (held-out attacks-v10's log-softmax)
        for wraps in (31, 32):
            self.past_int32(direction, on_gpu, wraps)
        self.phase("past-int32", started)

    def timed_draw(self, base: Case, seed: int, index: int) -> Case:
        """The timed phase's `index`-th input set: the base's classes and every other set another
        class, as the screen draws it (fresh_case)."""
        return fresh_case(base, seed, self.domain) if index % 2 else dataclasses.replace(base, seed=seed)

    def past_int32(self, direction: str, on_gpu: bool, wraps: int = 31) -> None:
        """The case whose largest tensor holds just over 2^`wraps` elements (past_int32_case: a signed
        32-bit offset wraps past 2^31, an unsigned one past 2^32), run whole
        or not at all (shrunk it would not reach the mark), prepared lean (a float32 truth for
        16-bit inputs, no working-dtype reference: it is there to catch a wrong row, not a
        rounding). The memory plan's cost per element is conservative (CHECK_OVERHEAD, the
        arena's headroom) and cross_entropy's backward there, prepared in full, planned at 1.8x
        what it allowed on the H200 (session 29): this case is tried up to
        PAST_INT32_ALLOWANCE times the plan, and running out of memory while preparing or
        checking it is a `not run` in the verdict's `scaled to GPU memory` line, never a verdict
        on the kernel."""
        import torch

        from .arena import ArenaError
        from . import strategies  # (its INT32_ELEMENTS read at call time: tests lower it)
        from .memory import available_bytes, elements_that_fit

        case = strategies.past_int32_case(self.spec, self.options.seed + 700 + wraps - 31,
                               limit=strategies.INT32_ELEMENTS << (wraps - 31))
        if case is None:
            return
        elements = strategies.case_elements(self.spec.signature, case.dim_map, direction)
        where = f"{direction} past 2^{wraps} elements {case.describe()}"
        sampled = False  # the truth on sampled rows only (sampled_rows.py, version 14)
        if not on_gpu:  # the CPU stand-ins reach it only where a test lowers the marks
            if elements > CPU_PAST_INT32_ELEMENTS:
                if elements > CPU_SAMPLED_ELEMENTS:
                    return
                sampled = True
        else:
            fit = elements_that_fit(self.per_element(direction, case.dtype, lean=True), available_bytes(self.device))
            if elements > fit * PAST_INT32_ALLOWANCE:
                bare = elements_that_fit(self.per_element(direction, case.dtype, lean=True, later=True),
                                         available_bytes(self.device))
                if elements > bare * PAST_INT32_ALLOWANCE:
                    self.not_run(where, f"{elements} elements, {bare} planned to fit the GPU memory free now "
                                        f"even without a truth")
                    return
                sampled = True
        symbol = self.sampled_symbol(direction, case) if sampled else None
        if sampled and symbol is None:
            self.not_run(where, f"{elements} elements: its whole truth does not fit, and its outputs' rows are not "
                                f"computed from their own input rows alone (sampled rows cannot stand for it)")
            return
        self.progress(where + (f" (the truth on sampled rows of {symbol})" if sampled else ""))
        data = None
        try:
            # a float32 truth, no working-dtype reference; sampled: the truth of its rows when checked
            data = self.prepare(case, direction, lean=True, later=sampled)
            stage(self.runner, data, snapshots=False)
            self.cases += 1
            if sampled:
                check_sampled_rows(self.runner, self.spec, data, symbol, deterministic=self.spec.deterministic,
                                   stream=FULL_SIZE_STREAMS[0])
            else:
                check_case(self.runner, data, deterministic=self.spec.deterministic, stats={},
                           stream=FULL_SIZE_STREAMS[0])
        except (torch.OutOfMemoryError, ArenaError) as error:
            del data
            data = None
            if on_gpu:
                torch.cuda.empty_cache()
            self.not_run(where, f"out of memory ({str(error).splitlines()[0][:200]})")
        del data

    def sampled_symbol(self, direction: str, case: Case) -> str | None:
        """The symbol `case`'s rows are sampled along, where the spec computes them row by row
        (sampled_rows.separable, probed once a direction); None otherwise."""
        from .sampled_rows import separable, sliced_symbol

        symbol = sliced_symbol(self.spec, direction, case.dim_map)
        if symbol is None:
            return None
        key = (direction, symbol)
        if key not in self._separable:
            try:
                self._separable[key] = separable(self.spec, direction, symbol, self.device,
                                                 seed=self.options.seed + 730)
            except Exception:  # noqa: BLE001 - a probe that cannot be made says nothing: not sampled
                self._separable[key] = False
        return symbol if self._separable[key] else None

    def not_run(self, where: str, why: str) -> None:
        self.progress(f"{where}: not run, {why}")
        self.shrunk.append(f"{where}: not run ({why})")

    def per_element(self, direction: str, dtype: str, lean: bool = False, later: bool = False) -> float:
        """Device bytes one case element costs in this spec, direction and dtype (memory.py),
        measured once on a probe case (prepared `lean` or not, `later`: without its truth; data.prepare)."""
        from .memory import PROBE_ELEMENTS, bytes_per_element
        from .strategies import case_elements

        key = (direction, dtype, lean, later)
        if key not in self._per_element:
            sig = self.spec.signature
            top = {s: self.spec.dims[s][1] for s in sig.symbols()}
            probe = make_case(fit_budget(sig, top, self.spec.dims, PROBE_ELEMENTS), dtype, seed=self.options.seed + 77)
            self._per_element[key] = bytes_per_element(lambda: prepare(self.spec, probe, direction, self.device,
                                                                       lean=lean, later=later),
                                                       case_elements(sig, probe.dim_map, direction), self.device)
        return self._per_element[key]

    def fit_memory(self, case: Case, direction: str, copies: int = 1) -> Case:
        """The case, or the case shrunk until `copies` of it fit the GPU memory free now."""
        from .memory import available_bytes, elements_that_fit
        from .strategies import case_elements

        sig = self.spec.signature
        fit = elements_that_fit(self.per_element(direction, case.dtype) * copies, available_bytes(self.device))
        if case_elements(sig, case.dim_map, direction) <= fit:
            return case
        # the row's width kept while other dims can give: the widths (a vocabulary, a model size)
        # are what kernels dispatch on; halving 128256 columns to 64128 met no chunked path (session 26)
        dims = fit_budget(sig, case.dim_map, self.spec.dims, fit, keep=row_symbol(sig), direction=direction)
        smaller = dataclasses.replace(case, dims=tuple(dims.items()))
        self.shrunk.append(f"{direction} {case.describe()} -> {smaller.describe()}")
        self.progress(f"{direction}: {case.describe()} does not fit the GPU memory free now; {smaller.describe()}")
        return smaller

    def within_memory(self, base: Case, direction: str, count: int, run: Callable[[int], object]):
        """(sets, run(sets)): the timed run on `count` input sets, or on half as many while the
        GPU cannot hold them (the plan reads the free memory once; a 13 GB ELU row asked for a
        48 GB arena that the H200 did not have then, session 10). Below MIN_TIMED_SETS: an
        environment error naming the shape, not a verdict on the kernel."""
        from ..errors import EnvironmentMissing
        from .arena import ArenaError
        from .memory import MIN_TIMED_SETS

        while True:
            try:
                return count, run(count)
            except ArenaError as error:
                if count <= MIN_TIMED_SETS:
                    raise EnvironmentMissing(
                        f"{self.spec.path}: the benchmark shape {base.describe()} ({direction}) needs more GPU "
                        f"memory than is free for its timed calls ({error}); free the GPU or list a smaller "
                        f"shape under `benchmark:`") from None
                self.shrunk.append(f"{direction} timed {base.describe()}: {count // 2} input sets after "
                                   f"{count} did not fit ({error})")
                count = max(MIN_TIMED_SETS, count // 2)

    def timed_sets(self, base: Case, direction: str, wanted: int) -> int:
        """How many input sets of a benchmark shape fit beside each other (memory.py)."""
        from .memory import available_bytes, timed_sets_that_fit
        from .strategies import call_bytes, case_elements

        sig = self.spec.signature
        nbytes = call_bytes(sig, base.dim_map, base.dtype, direction)
        count = timed_sets_that_fit(wanted, set_input_bytes=nbytes, output_bytes=nbytes,
                                    per_element=self.per_element(direction, base.dtype),
                                    elements=case_elements(sig, base.dim_map, direction),
                                    available=available_bytes(self.device))
        if count < wanted:
            self.shrunk.append(f"{direction} timed {base.describe()}: {count} input sets, not {wanted}")
        return count

    def hypothesis(self, direction: str) -> None:
        """Hypothesis cases; a failure is shrunk (within SHRINK_SECONDS) to a small counterexample."""
        if self.options.examples <= 0:
            return
        seen: dict[Case, Failure | None] = {}
        fatal: list[Failure] = []
        found_at: list[float] = []

        @settings(max_examples=self.options.examples, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False,
                  phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False)
        @hypothesis_seed(self.options.seed)
        @given(case_strategy(self.spec, self.options.budget, self.domain))
        def property_(case: Case) -> None:
            if case in seen:
                if seen[case] is not None:
                    raise seen[case]
                return
            if fatal or (found_at and time.monotonic() - found_at[0] > SHRINK_SECONDS):
                assume(False)  # stop exploring: keep the smallest failure found so far
            try:
                self.run_case(case, direction)
            except Failure as failure:
                seen[case] = failure
                if failure.fatal:
                    fatal.append(failure)
                found_at.append(time.monotonic())
                raise
            seen[case] = None

        try:
            property_()
        except Failure as failure:
            raise (fatal[0] if fatal else failure) from None
        except BaseException:
            if fatal:
                raise fatal[0] from None
            failures = [f for f in seen.values() if f is not None]
            if failures:  # Hypothesis gave up in its own way (flaky replay...): report what was found
                raise failures[-1] from None
            raise


def timed_pairs(shapes: list, dtypes: list) -> list[tuple]:
    """The (benchmark shape, dtype) pairs the timed phase runs: every shape and every dtype at
    least once (shape i with dtype i mod n), not every combination. The phase proves that a
    timed call computes what a checked one does; `specgen bench` times every combination, also
    through checked calls. Each pair costs six full-size input sets with their float64 truths."""
    count = max(len(shapes), len(dtypes)) if shapes else 0
    return [(shapes[i % len(shapes)], dtypes[i % len(dtypes)]) for i in range(count)]


def _flush_bytes() -> int:
    from ..bench import flush_bytes

    return flush_bytes()


def run_verification(spec, library, options: Options, progress: Progress = lambda text: None,
                     device: str = "cuda", isolated: bool | None = None,
                     waiting: Callable[[float], None] | None = None) -> Verdict:
    """The verdict of one compiled candidate. Raises only for harness problems (e.g. a broken
    reference); everything the kernel does wrong becomes the verdict. A library path on a GPU
    runs in its own process (`isolated`, the default); a stand-in object runs here."""
    from .isolation import LocalRunner, started_runner

    started = time.perf_counter()
    isolated = isolated if isolated is not None else (torch.device(device).type == "cuda"
                                                      and not hasattr(library, "call"))
    separate = options.quick and not isolated  # the sanitizer's run: one allocation per tensor
    directions = options.directions or (("forward", "backward") if spec.backward == "kernel" else ("forward",))

    def isolated_runner(readonly: bool = True, build=None):  # build: another build of it (char_abi.py)
        runner = started_runner(spec, readonly_inputs=readonly)
        runner.wait_ready(heartbeat=lambda seconds: progress(f"starting the kernel's own process ({seconds:.0f} s; "
                                                             "none of its code runs before it is ready)"))
        outcome = runner.load(build or library)
        if outcome.fatal:
            runner.close()
            raise Failure(CRASH, f"loading the kernel library: {outcome.fatal}", fatal=True)
        return runner

    session = None
    runner = None
    try:
        runner = isolated_runner() if isolated else LocalRunner(spec, library, device, separate=separate)
        session = Session(spec, runner, options, progress, device, waiting=waiting,
                          writable_runner=(lambda: isolated_runner(False)) if isolated else None,
                          fresh_runner=isolated_runner if isolated else None)
        session.refused_runner = refused_runner(spec, library, progress) if isolated else None  # (version 16)
        session.slow_runner = slow_runner(spec, library, progress) if isolated else None  # (version 16)
        session.unsigned_char_runner = unsigned_char_runner(spec, options, device, isolated, isolated_runner)  # (v16)
        for direction in directions:
            session.direction(direction)
        verdict = Verdict(PASSED, f"{session.cases} cases over {', '.join(directions)} passed every check"
                          + "".join(f"; {note}" for note in session.domain_notes()))
    except Failure as failure:
        verdict = Verdict.from_failure(failure)
        verdict.fatal = verdict.fatal and not isolated  # a crash in the candidate's process leaves us intact
    except RuntimeError as error:  # torch noticed the GPU is broken after the kernel ran
        text = str(error).lower()
        if "cuda" not in text or "out of memory" in text or "cuMemCreate" in str(error):
            raise  # the judge's own problem (no memory for the arenas...), not the kernel's
        if isolated:  # the kernel runs in its own process: a CUDA error here is the truth's (the reference's)
            raise reference_failure(spec, error, "on the GPU in the verifier's own process, where the reference "
                                                 "computes the truth (the kernel runs in another process): the "
                                                 "reference fails on some input values there (a device-side "
                                                 "assert?) that it accepts on the CPU") from None
        verdict = Verdict(CRASH, f"the GPU failed after the kernel ran: {str(error).strip().splitlines()[0]}",
                          fatal=True)
    finally:
        if runner is not None:
            runner.close()
    if session is not None:
        verdict.cases = session.cases
        verdict.tolerances = session.tolerances
        verdict.timings.update({f"timed_us {k}": v for k, v in session.timed.items()})
        verdict.timings.update({f"phase_s {k}": v for k, v in session.phases.items()})
        if session.shrunk:
            verdict.timings["scaled to GPU memory"] = "; ".join(session.shrunk)
    verdict.timings["verify_s"] = round(time.perf_counter() - started, 3)
    return verdict
