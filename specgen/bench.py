"""Measuring honestly: a candidate, eager PyTorch and torch.compile of the reference, on the
same inputs in one run, against the device-to-device copy bandwidth measured in that run.

- CUDA events around each call, warm-up first, the median of many runs;
- L2 flushed before every run (a buffer of at least twice the L2 is written);
- several input sets used in turn, so no run finds its inputs in cache from the last one;
- bytes moved = every input read once + every output written once (from the signature);
  roofline time = bytes / copy bandwidth. A kernel faster than that is a measurement bug.

`time_callable` and `bench_spec` are the reusable core (the autotuner and the agent loop
call them); `specgen bench` prints and writes what `bench_spec` returns.
"""
from __future__ import annotations

import ctypes
import functools
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import abi
from .inputs import TORCH_DTYPES, as_tuple, expected_outputs, make_tensor

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
    del src, dst
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


def moved_bytes(spec, dims: dict, dtype: str) -> int:
    """Every input read once plus every output written once."""
    sig = spec.signature
    total = 0
    for p in sig.inputs:
        total += math.prod(p.type.shape(dims)) * torch.empty((), dtype=TORCH_DTYPES[p.type.dtype_for(dtype)]).element_size()
    for shape, tdtype in expected_outputs(sig, dims, dtype):
        total += math.prod(shape) * torch.empty((), dtype=tdtype).element_size()
    return total


def bench_inputs(spec, dims: dict, dtype: str, seed: int) -> dict:
    """Inputs drawn on the GPU (benchmark shapes are large); integer tensors in their declared range."""
    gen = torch.Generator().manual_seed(seed)
    args = {}
    for param in spec.signature.params:
        if not param.is_tensor:
            args[param.name] = param.default if param.has_default else {"float": 0.5, "int": 1, "bool": False}[
                param.type.kind]
        elif param.type.is_floating and param.type.value_range is None:
            args[param.name] = torch.randn(param.type.shape(dims), device="cuda",
                                           dtype=TORCH_DTYPES[param.type.dtype_for(dtype)])
        else:
            args[param.name] = make_tensor(param.type, dims, dtype, distribution="normal", gen=gen, device="cuda")
    return args


_compiled_refs: dict[str, Callable] = {}


def _compiled_reference(spec) -> Callable:
    key = spec.hash()
    if key not in _compiled_refs:
        _compiled_refs[key] = torch.compile(spec.reference_fn(), dynamic=False)
    return _compiled_refs[key]


class _Candidate:
    """A kernel library with its argument structs packed once per input set, so a timed call
    costs one ctypes call and no Python packing."""

    def __init__(self, spec, library: Path, sets: list[dict], dims: dict, dtype: str):
        from .verify.runner import KernelLibrary

        self.lib = KernelLibrary(spec, library)
        if not self.lib.has("forward"):
            raise ValueError(f"{library} does not export {spec.name}_forward")
        self.fn = self.lib.entry("forward")
        sig = spec.signature
        self.outputs = [{o.name: torch.empty(shape, dtype=tdtype, device="cuda")
                         for o, (shape, tdtype) in zip(sig.outputs, expected_outputs(sig, dims, dtype))}
                        for _ in sets]
        self.structs = []
        for args, outs in zip(sets, self.outputs):
            tensors = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
            scalars = {k: v for k, v in args.items() if not isinstance(v, torch.Tensor)}
            self.structs.append(abi.pack_args(spec, "forward", {**tensors, **outs}, scalars, dims))
        self.addresses = [ctypes.addressof(s) for s in self.structs]

    def call(self, index: int) -> None:
        code = self.fn(self.addresses[index], ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if code:
            raise RuntimeError(f"the kernel returned {self.lib.error_name(code)} ({code})")


def _rotating(fn: Callable[[int], object], count: int) -> Callable[[], object]:
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % count
        return fn(state["i"])
    return call


def bench_spec(spec, library: Path | None = None, shapes: list[dict] | None = None, dtypes: list[str] | None = None,
               *, baseline: Path | None = None, eager: bool = True, compiled: bool = True,
               warmup: int = DEFAULT_WARMUP, reps: int = DEFAULT_REPS, input_sets: int = INPUT_SETS,
               on_row: Callable[[BenchRow], None] | None = None) -> BenchResult:
    """Time the candidate (and baseline), eager and torch.compile over shapes x dtypes."""
    shapes = shapes or spec.benchmark
    if not shapes:
        raise ValueError(f"spec {spec.name} has no benchmark shapes; pass shapes explicitly")
    dtypes = dtypes or list(spec.dtypes)
    copy_gbs = copy_bandwidth_gbs()
    reference = spec.reference_fn()
    rows = []
    for dims in shapes:
        for dtype in dtypes:
            nbytes = moved_bytes(spec, dims, dtype)
            row = BenchRow(spec.name, dict(dims), dtype, nbytes, nbytes / (copy_gbs * 1e9) * 1e6, copy_gbs)
            sets = [bench_inputs(spec, dims, dtype, seed) for seed in range(input_sets)]
            timed = lambda fn: time_callable(_rotating(fn, len(sets)), warmup=warmup, reps=reps).median_us
            with torch.no_grad():
                if eager:
                    row.eager_us = timed(lambda i: reference(**sets[i]))
                if compiled:
                    try:
                        fn = _compiled_reference(spec)
                        started = time.perf_counter()
                        for args in sets:
                            as_tuple(fn(**args))
                        torch.cuda.synchronize()
                        row.compile_seconds = round(time.perf_counter() - started, 2)
                        row.compile_us = timed(lambda i: fn(**sets[i]))
                    except Exception as error:  # no triton, an unsupported op...: report, keep going
                        row.notes.append(f"torch.compile failed: {type(error).__name__}: {str(error)[:200]}")
                for name, lib in (("kernel", library), ("baseline", baseline)):
                    if lib is not None:
                        candidate = _Candidate(spec, lib, sets, dims, dtype)
                        setattr(row, f"{name}_us", timed(candidate.call))
                        del candidate
            for name in ("kernel", "eager", "compile", "baseline"):
                fraction = row.fraction(getattr(row, f"{name}_us"))
                if fraction is not None and fraction > ROOFLINE_SLACK:
                    row.notes.append(f"{name} at {fraction:.2f}x the copy roofline: a measurement bug "
                                     f"(or the output is not really written)")
            rows.append(row)
            if on_row:
                on_row(row)
            del sets
            torch.cuda.empty_cache()
    return BenchResult(spec.name, torch.cuda.get_device_name(), copy_gbs, rows)


def benchmark_kernel(spec, library: Path, baseline: Path | None = None, **kw) -> BenchResult:
    """The agent loop's measurement: the spec's benchmark shapes and dtypes."""
    return bench_spec(spec, library, baseline=baseline, **kw)
