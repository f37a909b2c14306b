"""A verification's outcome: one stable reason string, a detail fit to show a user or an LLM,
and (for result failures) the counterexample that shows it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

# The stable reasons, in the order the verifier can reach them.
PASSED = "passed"
COMPILE_ERROR = "compile-error"
FORBIDDEN_SYMBOL = "forbidden-symbol"
ENTRY_POINT_MISSING = "entry-point-missing"
SANITIZER = "sanitizer"
CUDA_ERROR = "cuda-error"
CRASH = "crash"
TIMEOUT = "timeout"
INPUT_MUTATED = "input-mutated"
UNWRITTEN_OUTPUT = "unwritten-output"
NONDETERMINISTIC = "nondeterministic"
WRONG_RESULT = "wrong-result"
STREAM_VIOLATION = "stream-violation"
POST_TIMING_MISMATCH = "post-timing-mismatch"  # an output produced while timed is wrong or unwritten
NOT_CAPTURABLE = "not-capturable"  # the call cannot be captured into a CUDA graph on `stream`
OUT_OF_BOUNDS = "out-of-bounds"  # guard bytes around a tensor changed
FASTER_THAN_PHYSICS = "faster-than-physics"  # a timing below the memory / arithmetic floor
REMEMBERS_INPUTS = "remembers-inputs"  # calls on inputs seen before run faster than on new ones
BAD_WORKSPACE = "bad-workspace"  # the size function asks for an unbelievable number of bytes
# a call (or the library's load) left the calling host thread's floating-point environment changed
# (MXCSR FTZ/DAZ, rounding, traps; FPCR on aarch64): candidate_main.fp_report, verifier version 10
HOST_STATE_CHANGED = "host-state-changed"
# the device's default memory pool holds more after a request's calls than before (cudaMallocAsync
# scratch never freed): candidate_main.pool_in_use, verifier version 12
LEAKED_MEMORY = "leaked-memory"

REASONS = (PASSED, COMPILE_ERROR, FORBIDDEN_SYMBOL, ENTRY_POINT_MISSING, SANITIZER, CUDA_ERROR, CRASH, TIMEOUT,
           INPUT_MUTATED, UNWRITTEN_OUTPUT, NONDETERMINISTIC, WRONG_RESULT, STREAM_VIOLATION,
           POST_TIMING_MISMATCH, NOT_CAPTURABLE, OUT_OF_BOUNDS, FASTER_THAN_PHYSICS, REMEMBERS_INPUTS,
           BAD_WORKSPACE, HOST_STATE_CHANGED, LEAKED_MEMORY)

# The stream a call ran on (graphs.STREAM_KINDS), in a counterexample's words
STREAM_WORDS = {"pool": "on a stream of its own (non-blocking, torch.cuda.Stream())",
                "legacy": "on the legacy default stream (handle 0: what the package passes in a program that "
                          "never makes a stream)",
                "per_thread": "on cudaStreamPerThread (handle 2)"}


@dataclass
class Counterexample:
    """The (shrunk) case a check failed on, and where the outputs went wrong."""

    direction: str  # forward | backward
    case: dict  # Case.to_json(): dims, dtype, distribution, seed, offset
    output: str | None = None  # the failing tensor's name (an output; an input for input-mutated)
    tensor_role: str = "output"
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    index: list[int] | None = None  # the worst element
    expected: float | None = None
    got: float | None = None
    bad_elements: int | None = None
    total_elements: int | None = None
    where: list[str] = field(default_factory=list)  # "tail: elements 96.. of 111", "first row", "NaN", ...
    stream: str | None = None  # the kind of stream the failing calls ran on (STREAM_WORDS), where a check chose it

    def describe(self) -> str:
        dims = " ".join(f"{k}={v}" for k, v in self.case["dims"].items())
        parts = [f"{self.direction} {dims} {self.case['dtype']} ({self.case['distribution']} values, "
                 f"seed {self.case['seed']}" + (f", inputs offset by {self.case['offset']} element(s)"
                                                if self.case.get("offset") else "")
                 + (f", {self.case['gradients']} output gradients" if self.case.get("gradients") else "") + ")"
                 + (f", called {STREAM_WORDS.get(self.stream, self.stream)}" if self.stream else "")]
        if self.output is not None:
            text = f"{self.tensor_role} {self.output!r}"
            if self.bad_elements is not None:
                text += f": {self.bad_elements} of {self.total_elements} elements bad"
            parts.append(text)
        if self.max_abs_error is not None:
            parts.append(f"max abs error {self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}")
        if self.index is not None:
            parts.append(f"worst at index {tuple(self.index)}: expected {self.expected!r}, got {self.got!r}")
        if self.where:
            parts.append("where: " + "; ".join(self.where))
        return "\n  ".join(parts)


class Failure(Exception):
    """Raised inside the checks: ends the verification with this verdict reason."""

    def __init__(self, reason: str, detail: str, counterexample: Counterexample | None = None,
                 fatal: bool = False):
        assert reason in REASONS, reason
        self.reason = reason
        self.detail = detail
        self.counterexample = counterexample
        self.fatal = fatal  # the CUDA context is gone: the worker must not run anything else
        super().__init__(f"{reason}: {detail}")


@dataclass
class Verdict:
    reason: str
    detail: str = ""
    counterexample: Counterexample | None = None
    tolerances: dict = field(default_factory=dict)  # direction/dtype -> {spec_atol, spec_rtol, max_atol_used}
    cases: int = 0  # cases run (each twice, with two output fills)
    timings: dict = field(default_factory=dict)  # compile_s, verify_s, sanitize_s, ...
    log: str = ""  # e.g. compute-sanitizer's report, nvcc's diagnostics
    kernel: str | None = None
    spec: str | None = None
    fatal: bool = False  # the CUDA context was lost: the worker that ran it must be replaced

    @property
    def passed(self) -> bool:
        return self.reason == PASSED

    @classmethod
    def from_failure(cls, failure: Failure, **kw) -> "Verdict":
        return cls(failure.reason, failure.detail, failure.counterexample, fatal=failure.fatal, **kw)

    def summary(self) -> str:
        """Plain text for a terminal or an LLM prompt."""
        lines = [f"verdict: {self.reason}"]
        if self.detail:
            lines.append(self.detail)
        if self.counterexample is not None:
            lines.append("counterexample: " + self.counterexample.describe())
        if self.tolerances:
            lines.append("tolerance: " + "; ".join(f"{key} {tolerance_text(t)}"
                                                   for key, t in self.tolerances.items()))
        return "\n".join(lines)

    def to_json(self) -> dict:
        data = asdict(self)
        data["passed"] = self.passed
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Verdict":
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if data.get("counterexample"):
            data["counterexample"] = Counterexample(**data["counterexample"])
        return cls(**data)


def tolerance_text(t: dict) -> str:
    text = f"atol={t['spec_atol']:.3g} rtol={t['spec_rtol']:.3g}"
    if t.get("max_widening", 0) > 0:
        text += (f" (widened element by element where the reference itself errs, by up to "
                 f"{t['max_widening']:.3g})")
    if t.get("max_widening_cpu_reference", 0) > 0:
        text += (f" (and where torch's CPU reference errs more than its GPU one, by up to "
                 f"{t['max_widening_cpu_reference']:.3g})")
    if t.get("max_abs_error") is not None:
        text += f"; largest error of the kernel {t['max_abs_error']:.3g}"
    if t.get("max_error_norm_ratio") is not None:  # measured, not a check (checks.error_norm_ratio)
        text += (f"; its error norm up to {t['max_error_norm_ratio']:.3g}x the reference's "
                 f"(+ the dtype's rounding)")
    return text
