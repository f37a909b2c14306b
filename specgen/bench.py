"""Measuring honestly: a candidate, eager PyTorch and torch.compile of the reference, on the
same inputs in one run, against the device-to-device copy bandwidth measured in that run.

- CUDA events around each call, warm-up first, the median of many runs;
- L2 flushed before every run (a buffer of at least twice the L2 is written);
- several input sets used in turn, so no run finds its inputs in cache from the last one;
- the kernel runs in its own process and is timed by verify/timed.py: each output poisoned
  before and checked after its call; a time under the physics floor (verify/physics.py) rejects;
- bytes moved = every input read once + every output written once (from the signature);
  roofline time = bytes / copy bandwidth. A kernel faster than that is a measurement bug.
- torch.compile (default mode, static shapes): a fresh compiled reference per (shape, dtype,
  direction) after `torch._dynamo.reset()`, so no shape or dtype counts against dynamo's
  recompile limit; compile time is excluded; a row whose compiled reference fell back to
  eager anyway (nothing compiled, a recompile while timed, the limit hit) is marked.
- backward (`directions=("forward", "backward")`): the kernel's `<op>_backward` through the
  ABI; eager and compile are `torch.autograd.grad` through the (compiled) reference, whose
  forward runs once per input set outside the timed region (retain_graph=True), so only the
  backward is timed, as for the kernel. Bytes: the forward inputs and the output gradients
  read once, the input gradients written once. The forward outputs are passed to the kernel
  too, but a backward needs them or the inputs they came from, not both (softmax reads y,
  GELU reads x); counting both would overstate the roofline, so they are not counted.
  The baselines' forward is also timed as a training step runs it (`*_graph_us`: grad on,
  saving what their backward reads): their backward alone may read a saved mask instead of the
  inputs and beat the byte roofline; forward-recording + backward is the step's cost.

`time_callable` and `bench_spec` are the reusable core (the autotuner and the agent loop
call them); `specgen bench` prints and writes what `bench_spec` returns.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import abi
from .inputs import TORCH_DTYPES, as_tuple, make_tensor

DEFAULT_WARMUP = 5
DEFAULT_REPS = 40
INPUT_SETS = 3
COPY_BYTES = 1 << 29  # 512 MiB each way for the copy roofline
ROOFLINE_SLACK = 1.05  # above this fraction of the copy roofline, a timing is suspect


@dataclass
class TimingStats:
    median_ms: float
    min_ms: float
    max_ms: float
    reps: int

    @property
    def median_us(self) -> float:
        return self.median_ms * 1000.0


@functools.lru_cache(maxsize=4)
def _flush_buffer(device_index: int) -> torch.Tensor:
    props = torch.cuda.get_device_properties(device_index)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (64 << 20)
    return torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device=f"cuda:{device_index}")


def flush_l2() -> None:
    """Write a buffer of at least twice the L2 so nothing from the last run stays cached."""
    _flush_buffer(torch.cuda.current_device()).zero_()


def flush_bytes() -> int:
    """The size of the L2 flush (the candidate's process flushes with a buffer of its own)."""
    return _flush_buffer(torch.cuda.current_device()).numel()


def time_callable(fn: Callable[[], object], *, warmup: int = DEFAULT_WARMUP, reps: int = DEFAULT_REPS,
                  flush: bool = True) -> TimingStats:
    """Median GPU time of `fn()` on the current stream, by CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        if flush:
            flush_l2()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return TimingStats(statistics.median(times), min(times), max(times), reps)


@functools.lru_cache(maxsize=1)
def copy_bandwidth_gbs(nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy bandwidth (bytes read + bytes written per second), GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    stats = time_callable(lambda: dst.copy_(src), warmup=3, reps=20, flush=False)
    src = dst = None  # freed before the next measurement
    return 2 * nbytes / (stats.median_ms * 1e-3) / 1e9


# ------------------------------------------------------------------ one spec

@dataclass
class BenchRow:
    op: str
    dims: dict
    dtype: str
    bytes: int
    roofline_us: float
    copy_gbs: float
    kernel_us: float | None = None
    eager_us: float | None = None
    compile_us: float | None = None
    baseline_us: float | None = None
    compile_seconds: float | None = None  # torch.compile's own time for this shape (excluded above)
    notes: list[str] = field(default_factory=list)
    direction: str = "forward"
    compile_fallback: str | None = None  # why compile_us is (partly) eager time; None: it compiled
    rejected: str | None = None  # "<reason>: <detail>" when a timed call's output or time was impossible
    floor_us: float | None = None  # the physics floor of this row (verify/physics.py)
    # backward rows: the baselines' forward as a training step runs it (recording the autograd graph,
    # saving what their backward reads). Their backward alone may read less than the inputs (a saved
    # mask, a saved difference) and come in above the byte roofline; forward-recording + backward is
    # what a step pays, set against the kernel's forward + backward (benchmarks/level1_bench.py)
    eager_graph_us: float | None = None
    compile_graph_us: float | None = None

    def gbs(self, us: float | None) -> float | None:
        return None if not us else self.bytes / (us * 1e-6) / 1e9

    def fraction(self, us: float | None) -> float | None:
        """Fraction of the copy roofline reached (1.0 = as fast as a copy of the same bytes)."""
        return None if not us else self.roofline_us / us

    def as_dict(self) -> dict:
        data = asdict(self)
        for name in ("kernel", "eager", "compile", "baseline"):
            us = getattr(self, f"{name}_us")
            data[f"{name}_gbs"] = self.gbs(us)
            data[f"{name}_roofline_fraction"] = self.fraction(us)
        data["speedup_vs_eager"] = _ratio(self.eager_us, self.kernel_us)
        data["speedup_vs_compile"] = _ratio(self.compile_us, self.kernel_us)
        return data


def _ratio(slow: float | None, fast: float | None) -> float | None:
    return slow / fast if slow and fast else None


@dataclass
class BenchResult:
    op: str
    device: str
    copy_gbs: float
    rows: list[BenchRow]

    def as_record(self) -> dict:
        return {"op": self.op, "device": self.device, "copy_gbs": self.copy_gbs,
                "rows": [row.as_dict() for row in self.rows]}

    @property
    def rejected(self) -> list[str]:
        """Why the candidate cannot be trusted, one line per rejected row (empty: none)."""
        return [f"{row.direction} {row.dtype} {row.dims}: {row.rejected}" for row in self.rows if row.rejected]


def moved_bytes(spec, dims: dict, dtype: str, direction: str = "forward", unread: frozenset = frozenset(),
                fractions: dict | None = None) -> int:
    """Bytes the op must move, from its ABI fields: forward, every input read once and every
    output and saved value written once; backward, the forward inputs, saved values and the output gradients read once and
    the input gradients written once (the forward outputs are not counted: see the module doc).
    `unread`: fields no output depends on (physics.unread_inputs: a sum's backward never reads x),
    which a correct kernel need not read, so they are not counted either; `fractions`
    (physics.read_fractions): fields counted at that fraction of their bytes."""
    counted = {"forward": ("input", "output", "saved"),
               "backward": ("input", "saved_input", "grad_output", "grad_input")}[direction]
    total = 0
    for f in abi.fields(spec, direction):
        if f.is_tensor and f.role in counted and f.name not in unread:
            itemsize = torch.empty((), dtype=TORCH_DTYPES[f.tensor.dtype_for(dtype)]).element_size()
            total += int(math.prod(f.tensor.shape(dims)) * itemsize * (fractions or {}).get(f.name, 1.0))
    return total


def bench_inputs(spec, dims: dict, dtype: str, seed: int, device: str = "cuda") -> dict:
    """Inputs drawn on the GPU (benchmark shapes are large); integer tensors in their declared range."""
    gen = torch.Generator().manual_seed(seed)
    args = {}
    for param in spec.signature.params:
        if not param.is_tensor:
            args[param.name] = param.default if param.has_default else {"float": 0.5, "int": 1, "bool": False}[
                param.type.kind]
        elif param.type.is_floating and param.type.value_range is None:
            args[param.name] = torch.randn(param.type.shape(dims), device=device,
                                           dtype=TORCH_DTYPES[param.type.dtype_for(dtype)])
        else:
            args[param.name] = make_tensor(param.type, dims, dtype, distribution="normal", gen=gen, device=device)
    return args


# ------------------------------------------------------------------ the backward's operands

def differentiable_inputs(spec) -> list[str]:
    """The inputs the backward differentiates (floating, not in `no_grad:`): the baselines' too."""
    return [p.name for p in spec.signature.inputs if p.type.differentiable]


def backward_operands(spec, args: dict) -> tuple[dict, dict]:
    """(forward outputs, output gradients) for one input set: what the backward reads besides
    the inputs. The forward outputs come from the reference (eager, no grad)."""
    with torch.no_grad():
        outs = as_tuple(spec.reference_fn()(**args))
    outputs = {o.name: t for o, t in zip(spec.signature.outputs, outs)}
    grads = {f"grad_{o.name}": torch.randn_like(t) for o, t in zip(spec.signature.outputs, outs)
             if o.type.is_floating}
    return outputs, grads


def autograd_backward(spec, fn: Callable, args: dict, grads: dict) -> Callable[[], object]:
    """A callable running only the backward of `fn` (the reference, eager or compiled): the
    forward runs once here, outside any timed region, and each call is
    `torch.autograd.grad(..., retain_graph=True)` through that graph."""
    wrt = differentiable_inputs(spec)
    leaves = _grad_leaves(args, wrt)
    with torch.enable_grad():
        outs = as_tuple(fn(**leaves))
    pairs = [(out, grads[f"grad_{o.name}"]) for o, out in zip(spec.signature.outputs, outs)
             if o.type.is_floating and out.requires_grad]
    if not pairs:
        raise ValueError(f"{spec.name}: no output of the reference depends on a floating input")
    outputs, grad_outputs = [p[0] for p in pairs], [p[1] for p in pairs]
    inputs = [leaves[k] for k in wrt]

    def run():
        return torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True)
    return run


def _grad_leaves(args: dict, wrt: list[str]) -> dict:
    """The inputs as the baselines' autograd sees them: those in `wrt` fresh leaves requiring grad."""
    return {k: (v.detach().requires_grad_(True) if k in wrt else v) for k, v in args.items()}


def autograd_forward(spec, fn: Callable, args: dict) -> Callable[[], object]:
    """A callable running `fn`'s forward as a training step does: grad on, the differentiable
    inputs leaves that require grad, so autograd records the graph and saves what the backward
    reads. Returns the outputs; a caller that drops them frees the graph, as a step's backward does."""
    leaves = _grad_leaves(args, differentiable_inputs(spec))

    def run():
        with torch.enable_grad():
            return fn(**leaves)
    return run


# ------------------------------------------------------------------ torch.compile, once per key

class CompileWatch:
    """What dynamo did to the compiled reference since this watch started, from its counters:
    whether anything compiled, recompiles, the recompile limit, graph breaks."""

    def __init__(self):
        from torch._dynamo.utils import counters

        self.counters = counters
        self.start = self._frames()
        self.compiled = self.start

    def _frames(self) -> tuple[int, int]:
        frames = self.counters["frames"]
        return frames["total"], frames["ok"]

    def mark_compiled(self) -> None:
        """Call after the untimed first calls: later frame conversions are recompiles."""
        self.compiled = self._frames()

    def fallback(self) -> str | None:
        """Why the compiled reference ran (partly) eager, or None when it ran compiled."""
        reasons = []
        total, ok = self.compiled
        if ok == self.start[1]:
            reasons.append("dynamo compiled no frame of the reference (it ran eager)")
        if self._frames()[0] > total:
            reasons.append(f"dynamo recompiled {self._frames()[0] - total} time(s) while timed")
        if any("recompile limit" in str(key).lower() for key in self.counters["unimplemented"]):
            reasons.append("dynamo hit its recompile limit (later calls run eager)")
        breaks = sum(self.counters["graph_break"].values())
        if breaks:
            reasons.append(f"{breaks} graph break(s): parts of the reference ran eager")
        return "; ".join(reasons) or None


def fresh_compiled(fn: Callable, backend: str = "inductor") -> tuple[Callable, CompileWatch]:
    """torch.compile(fn) (default mode, static shapes) with dynamo's caches and counters reset,
    so this (shape, dtype, direction) is compiled on its own and counts against no limit."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    return torch.compile(fn, dynamic=False, backend=backend), CompileWatch()


def _rotating(fn: Callable[[int], object], count: int) -> Callable[[], object]:
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % count
        return fn(state["i"])
    return call


# ------------------------------------------------------------------ the kernel, in its own process

class IsolatedKernel:
    """A candidate timed the way the verifier's timed phase times it (verify/timed.py): in its
    own process, outputs poisoned before and checked after every call, the physics floor."""

    def __init__(self, spec, library: Path):
        from .verify.isolation import IsolatedRunner

        self.spec = spec
        self.runner = IsolatedRunner(spec)
        outcome = self.runner.load(library)
        if outcome.fatal:
            self.runner.close()
            raise RuntimeError(f"the kernel library could not be loaded: {outcome.fatal}")

    def time(self, dims: dict, dtype: str, direction: str, *, input_sets: int, warmup: int, reps: int,
             seed: int = 0) -> tuple[float | None, float | None, str | None]:
        """(median us, floor us, None) or (None, None, "<reason>: <detail>")."""
        from .verify.data import prepare
        from .verify.strategies import make_case
        from .verify.timed import timed_calls
        from .verify.verdict import Failure

        sets = [prepare(self.spec, make_case(dims, dtype, seed=seed + i), direction, "cuda", later=True)
                for i in range(input_sets)]
        try:
            run = timed_calls(self.runner, self.spec, sets, reps=reps, warmup=warmup, flush_bytes=flush_bytes())
        except Failure as failure:
            return None, None, f"{failure.reason}: {failure.detail}"
        return run.median_us, run.floor_us, None

    def close(self) -> None:
        self.runner.close()


# ------------------------------------------------------------------ one spec

def bench_spec(spec, library: Path | None = None, shapes: list[dict] | None = None, dtypes: list[str] | None = None,
               *, baseline: Path | None = None, eager: bool = True, compiled: bool = True,
               directions: tuple[str, ...] = ("forward",),
               warmup: int = DEFAULT_WARMUP, reps: int = DEFAULT_REPS, input_sets: int = INPUT_SETS,
               on_row: Callable[[BenchRow], None] | None = None) -> BenchResult:
    """Time the candidate (and baseline), eager and torch.compile over shapes x dtypes x directions."""
    shapes = shapes or spec.benchmark
    if not shapes:
        raise ValueError(f"spec {spec.name} has no benchmark shapes; pass shapes explicitly")
    dtypes = dtypes or list(spec.dtypes)
    for direction in directions:
        if direction not in abi.DIRECTIONS:
            raise ValueError(f"direction must be one of {abi.DIRECTIONS}, not {direction!r}")
    if "backward" in directions and spec.backward == "none":
        raise ValueError(f"spec {spec.name} has no backward (backward: none)")
    from .verify.gpulock import exclusive_gpu

    with exclusive_gpu(torch.cuda.current_device()):  # timing beside other work times the other work
        return _bench_all(spec, library, baseline, shapes, dtypes, directions, eager=eager, compiled=compiled,
                          warmup=warmup, reps=reps, input_sets=input_sets, on_row=on_row)


def _bench_all(spec, library, baseline, shapes, dtypes, directions, *, eager, compiled, warmup, reps, input_sets,
               on_row) -> BenchResult:
    copy_gbs = copy_bandwidth_gbs()
    rows = []
    kernels = {name: IsolatedKernel(spec, lib) for name, lib in (("kernel", library), ("baseline", baseline))
               if lib is not None}
    try:
        for dims in shapes:
            for dtype in dtypes:
                for direction in directions:
                    row = _bench_one(spec, kernels, dims, dtype, direction, copy_gbs, eager=eager,
                                     compiled=compiled, warmup=warmup, reps=reps, input_sets=input_sets)
                    rows.append(row)
                    if on_row:
                        on_row(row)
                    torch.cuda.empty_cache()
    finally:
        for kernel in kernels.values():
            kernel.close()
    return BenchResult(spec.name, torch.cuda.get_device_name(), copy_gbs, rows)


def _bench_one(spec, kernels: dict, dims: dict, dtype: str, direction: str, copy_gbs: float, *,
               eager: bool, compiled: bool, warmup: int, reps: int, input_sets: int) -> BenchRow:
    from .verify.physics import read_fractions, unread_inputs

    # the verifier's byte floor counts the same bytes: a roofline fraction over 100% is not a number to print
    nbytes = moved_bytes(spec, dims, dtype, direction, unread_inputs(spec, direction), read_fractions(spec, direction))
    row = BenchRow(spec.name, dict(dims), dtype, nbytes, nbytes / (copy_gbs * 1e9) * 1e6, copy_gbs,
                   direction=direction)
    sets = [bench_inputs(spec, dims, dtype, seed) for seed in range(input_sets)]
    backward = direction == "backward"
    operands = [backward_operands(spec, args) if backward else ({}, {}) for args in sets]
    timed = lambda fn: time_callable(_rotating(fn, len(sets)), warmup=warmup, reps=reps).median_us
    reference = spec.reference_fn()

    def torch_steps(fn) -> list[Callable[[], object]]:
        """One callable per input set: the reference's forward (no grad) or its backward only."""
        if backward:
            return [autograd_backward(spec, fn, args, grads) for args, (_, grads) in zip(sets, operands)]
        return [functools.partial(_no_grad_call, fn, args) for args in sets]

    def graph_forward_us(fn) -> float | None:
        """The forward recording the graph, timed (a training step's forward); None, with a note,
        where it does not fit beside the row's tensors: the backward rows' times stand anyway."""
        try:
            forwards = [autograd_forward(spec, fn, args) for args in sets]
            return timed(lambda i: forwards[i]())
        except torch.cuda.OutOfMemoryError:
            row.notes.append("the baselines' forward recording the graph was not timed: out of GPU memory")
            return None
        finally:
            torch.cuda.empty_cache()  # the graphs' saved tensors, before the kernel's own inputs

    if eager:
        steps = torch_steps(reference)
        row.eager_us = timed(lambda i: steps[i]())
        del steps
        if backward:
            row.eager_graph_us = graph_forward_us(reference)
    if compiled:
        try:
            fn, watch = fresh_compiled(reference)
            started = time.perf_counter()
            steps = torch_steps(fn)  # backward: compiles the forward and the joint graph
            for step in steps:
                step()  # compiles the backward on its first call; compile time is excluded below
            torch.cuda.synchronize()
            watch.mark_compiled()
            row.compile_seconds = round(time.perf_counter() - started, 2)
            row.compile_us = timed(lambda i: steps[i]())
            del steps  # (their retained graphs: freed before the forwards record theirs)
            if backward:  # the same compiled forward (grad mode on, as the backward's steps traced it)
                row.compile_graph_us = graph_forward_us(fn)
            row.compile_fallback = watch.fallback()
            if row.compile_fallback:
                row.notes.append(f"torch.compile fell back to eager: {row.compile_fallback}")
        except Exception as error:  # no triton, an unsupported op...: report, keep going
            row.notes.append(f"torch.compile failed: {type(error).__name__}: {str(error)[:200]}")
    sets = operands = None  # the baselines' inputs: freed before the kernel's own sets
    for name, kernel in kernels.items():
        us, floor_us, rejected = kernel.time(dims, dtype, direction, input_sets=input_sets, warmup=warmup, reps=reps)
        setattr(row, f"{name}_us", us)
        row.floor_us = floor_us if name == "kernel" else row.floor_us
        if rejected and name == "kernel":
            row.rejected = rejected
            row.notes.append(f"kernel REJECTED: {rejected.splitlines()[0][:300]}")
        elif rejected:
            row.notes.append(f"baseline rejected: {rejected.splitlines()[0][:300]}")
    row.notes += roofline_notes(row)
    return row


def roofline_notes(row: BenchRow) -> list[str]:
    """A word on each time faster than the row's bytes allow. The kernel's is a measurement bug (or
    an output not really written); a baseline's backward reads what its forward saved (a mask, a
    difference) instead of the inputs the bytes count, so only its training step compares."""
    notes = []
    for name in ("kernel", "eager", "compile", "baseline"):
        fraction = row.fraction(getattr(row, f"{name}_us"))
        if fraction is None or fraction <= ROOFLINE_SLACK:
            continue
        if row.direction == "backward" and name in ("eager", "compile"):
            notes.append(f"{name}'s backward at {fraction:.2f}x the copy roofline of the inputs' bytes: it reads "
                         f"what its forward saved; compare forward + backward (the {name}_graph_us forward)")
        else:
            notes.append(f"{name} at {fraction:.2f}x the copy roofline: a measurement bug "
                         f"(or the output is not really written)")
    return notes


def _no_grad_call(fn: Callable, args: dict):
    with torch.no_grad():
        return fn(**args)


def benchmark_kernel(spec, library: Path, baseline: Path | None = None, **kw) -> BenchResult:
    """The agent loop's measurement: the spec's benchmark shapes and dtypes, forward."""
    return bench_spec(spec, library, baseline=baseline, **kw)
