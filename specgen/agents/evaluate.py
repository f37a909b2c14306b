"""Compile, verify and measure a candidate: the three sources of feedback for the loop.

`Evaluator` is the interface the loop is written against (tests substitute scripted
ones). `KernelEvaluator` is the real one: nvcc through specgen.toolchain, then the
verifier (specgen.verify) and the benchmark (specgen.bench), both imported only when a
GPU is present, so a machine without one still gets compile feedback.

Timings (what `measure` returns), all optional except kernel_us:
    {"kernel_us", "eager_us", "compile_us", "baseline_us",   # summed over benchmark shapes
     "roofline_fraction",                                     # roofline time / kernel time
     "per_shape": [{"dims": {...}, "dtype": "...", "kernel_us": ..., ...}, ...],
     "benchmark": {...}}                                      # the bench's own record, for the lock
"""
from __future__ import annotations

import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EnvironmentMissing, Rejected
from .base import Candidate, GpuFacts, KernelTask

MAX_DIAGNOSTIC_CHARS = 4000  # what the next prompt carries of nvcc's output


@dataclass
class CompileResult:
    ok: bool
    library: Path | None = None
    diagnostics: str = ""  # trimmed compiler output (errors first); warnings when ok
    seconds: float = 0.0


@dataclass
class Verdict:
    passed: bool
    reason: str = ""  # one line: what failed
    counterexample: dict[str, Any] | None = None  # shape, dtype, seed, max abs/rel error, where
    report: str = ""  # the verifier's text report (trimmed into the prompt)
    record: dict[str, Any] | None = None  # the lock's verification record when passed


class Evaluator(ABC):
    """What the loop needs to judge a candidate."""

    can_verify: bool = True  # False: compile feedback only (no GPU here)

    @abstractmethod
    def compile(self, candidate: Candidate) -> CompileResult: ...

    @abstractmethod
    def verify(self, candidate: Candidate, library: Path) -> Verdict: ...

    @abstractmethod
    def measure(self, candidate: Candidate, library: Path) -> dict[str, Any]: ...

    def lock_records(self, candidate: Candidate, details: dict[str, Any]) -> list:
        """Lock records for a winning candidate (none by default: tests, no GPU)."""
        return []


def trim(text: str, limit: int = MAX_DIAGNOSTIC_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... ({len(text) - limit} more characters of compiler output left out)"


def summarize_benchmark(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Timings from per-shape rows: sums of the times, roofline fraction of the totals."""
    timings: dict[str, Any] = {"per_shape": rows}
    for key in ("kernel_us", "eager_us", "compile_us", "baseline_us", "roofline_us"):
        values = [row.get(key) for row in rows]
        if rows and all(isinstance(v, (int, float)) for v in values):
            timings[key] = float(sum(values))
    if timings.get("roofline_us") and timings.get("kernel_us"):
        timings["roofline_fraction"] = timings["roofline_us"] / timings["kernel_us"]
    return timings


NOT_TIMED = ("not timed: the spec has no `benchmark:` shapes (add rows such as `benchmark: [{N: 4096}]` to "
             "time the kernel beside eager and torch.compile)")


@dataclass
class KernelEvaluator(Evaluator):
    """The real evaluator for one task: toolchain, verifier, benchmark."""

    task: KernelTask
    arch: str | None = None
    verify_options: dict[str, Any] = field(default_factory=dict)
    _include_dir: tempfile.TemporaryDirectory | None = None

    def __post_init__(self) -> None:
        from ..lock import gpu_available

        self.can_verify = gpu_available()
        self._include_dir = tempfile.TemporaryDirectory(prefix="specgen-abi-")
        (Path(self._include_dir.name) / self.task.header_name).write_text(self.task.header)

    def compile(self, candidate: Candidate) -> CompileResult:
        from ..toolchain import CompileError, check_symbols, compile_kernel, format_diagnostics

        spec = self.task.spec
        started = time.perf_counter()
        try:
            compiled = compile_kernel(candidate.source, include_dirs=[Path(self._include_dir.name)],
                                      arch=self.arch, name=spec.name, source_name=f"{spec.name}.cu")
        except CompileError as error:
            return CompileResult(False, None, trim(str(error)), time.perf_counter() - started)
        refusals = check_symbols(compiled.library, list(getattr(spec, "libraries", []) or []))
        if refusals:
            text = "the library links to symbols a kernel may not use:\n" + "\n".join(refusals)
            return CompileResult(False, None, trim(text), time.perf_counter() - started)
        warnings = format_diagnostics("warnings:", compiled.diagnostics) if compiled.diagnostics else ""
        return CompileResult(True, compiled.library, trim(warnings), time.perf_counter() - started)

    def verify(self, candidate: Candidate, library: Path) -> Verdict:
        from ..verify import verify_kernel  # needs torch and a GPU; imported only here

        # The verifier takes the source (it runs its own static checks; the compile is cached).
        verdict = verify_kernel(self.task.spec, candidate.source, arch=self.arch, **self.verify_options)
        result = Verdict(passed=bool(verdict.passed), reason=_reason(verdict),
                         counterexample=_counterexample(getattr(verdict, "counterexample", None)),
                         report=_report(verdict),
                         record=_record(verdict))
        return result

    def measure(self, candidate: Candidate, library: Path) -> dict[str, Any]:
        if not self.task.spec.benchmark:  # `benchmark:` is optional: a verified kernel with nothing to time
            return {"per_shape": [], "note": NOT_TIMED}
        try:  # needs torch and a GPU; imported only here
            from ..bench import benchmark_kernel
        except ImportError as error:
            raise EnvironmentMissing(f"the benchmark (specgen.bench.benchmark_kernel) is not available: "
                                     f"{error}") from None
        baseline = None if candidate is self.task.baseline else self._baseline_library()
        result = benchmark_kernel(self.task.spec, library, baseline=baseline)
        rejected = getattr(result, "rejected", None)
        if rejected:  # a timed output was wrong, or a time beat physics: nothing of it can be trusted
            raise Rejected("the benchmark rejected the kernel: " + "; ".join(rejected)[:2000])
        rows = [_plain(row) for row in getattr(result, "rows", None) or result.get("rows", [])]
        timings = summarize_benchmark(rows)
        timings["benchmark"] = result.as_record() if hasattr(result, "as_record") else _plain(result)
        return timings

    def _baseline_library(self) -> Path | None:
        baseline = self.task.baseline
        if baseline is None:
            return None
        compiled = self.compile(baseline)
        return compiled.library if compiled.ok else None

    def lock_records(self, candidate: Candidate, details: dict[str, Any]) -> list:
        from ..lock import Record, kernel_hash, gpu_available
        from ..toolchain import detect_gpu_arch

        verdict = details.get("verdict_record")
        if not gpu_available() or verdict is None:
            return []
        from .. import verify

        timings = details.get("timings") or {}
        return [Record(kernel_hash=kernel_hash(candidate.source), verifier_version=str(getattr(verify, "VERIFIER_VERSION", "1")),
                       gpu_arch=self.arch or detect_gpu_arch() or "unknown",
                       verification={**verdict, "sanitized": bool(self.verify_options.get("sanitize"))},
                       benchmark=timings.get("benchmark"))]


def _plain(value: Any) -> Any:
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    return value


def _counterexample(value: Any) -> dict[str, Any] | None:
    """The counterexample as flat key: value lines for the prompt (shape, dtype, seed, error, where)."""
    if value is None:
        return None
    data = _plain(value)
    if not isinstance(data, dict):
        return {"details": str(value)}
    flat: dict[str, Any] = {}
    case = data.get("case") or {}
    if case.get("dims"):
        flat["shape"] = ", ".join(f"{k}={v}" for k, v in case["dims"].items())
    for key in ("dtype", "distribution", "seed", "offset"):
        if case.get(key) not in (None, 0, ""):
            flat[key] = case[key]
    for key, item in data.items():
        if key in ("case", "inputs", "tensors") or item in (None, [], ""):
            continue
        if key == "where" and isinstance(item, list):
            item = "; ".join(map(str, item))
        if key == "index" and isinstance(item, list):
            item = tuple(item)
        flat[key] = item
    return flat


def _report(verdict: Any) -> str:
    for name in ("summary", "report"):
        value = getattr(verdict, name, None)
        if value is not None:
            return trim(str(value() if callable(value) else value), 3000)
    return ""


def _reason(verdict: Any) -> str:
    reason, detail = str(getattr(verdict, "reason", "") or ""), str(getattr(verdict, "detail", "") or "")
    return f"{reason}: {detail}" if detail else reason


def _record(verdict: Any) -> dict[str, Any] | None:
    """The verification record for the lock (the verifier's own JSON, without bulky logs)."""
    if not getattr(verdict, "passed", False):
        return None
    for name in ("record", "as_record", "to_record", "to_json"):
        value = getattr(verdict, name, None)
        if value is not None:
            data = _plain(value() if callable(value) else value)
            if isinstance(data, dict):
                data = {k: v for k, v in data.items() if k != "log"}
            return data
    return {"passed": True}


def gpu_facts() -> GpuFacts | None:
    """Facts about the visible GPU for the prompt; None without one. Bandwidth from the bench."""
    from ..lock import gpu_available

    if not gpu_available():
        return None
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bandwidth = None
    try:
        from .. import bench

        bandwidth = float(bench.copy_bandwidth_gbs())
    except Exception:  # the bench module or its measurement is optional for a prompt
        bandwidth = None
    return GpuFacts(name=props.name, arch=f"sm_{props.major}{props.minor}",
                    sms=props.multi_processor_count,
                    shared_mem_per_block=int(getattr(props, "shared_memory_per_block_optin", 0) or 0),
                    l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0), copy_bandwidth_gbs=bandwidth)
