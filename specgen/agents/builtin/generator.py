"""The builtin agent and the whole builtin flow: trace -> lower -> emit -> compile ->
(on a GPU: verify + autotune (tune.py) + benchmark) -> lock.

    from specgen.agents.builtin import generate_builtin
    result = generate_builtin(spec, gpu=None)   # None: use the GPU when there is one
"""
from __future__ import annotations

import functools
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ... import abi
from ..base import Agent, AgentExhausted, AgentRefused, Attempt, Candidate, KernelTask
from .emit import emit_source
from .families import family_of, lower_family
from .schedule import DEFAULT_VARIANT, H200_SMS, VARIANTS, Variant
from .families.scan import scan_directions
from .lower import lower
from .optimize import (centered_affine, cse, lone_norms, negated_compares, onehot_sums, reuse_forward_outputs,
                       row_broadcasts)
from .saved_rows import reuse_saved_rows, shared_logsumexp
from .trace import trace
from .validate import IRError, run_passes

_programs: dict[str, dict] = {}


def lower_spec(spec) -> dict:
    """The program of each direction the spec asks a kernel for (cached per spec hash): one
    kernel's, else stages of them or one kernel per int/bool value (the `last` families)."""
    return _lowered(spec, last=True)


def lower_whole(spec) -> dict:
    """As lower_spec, but one kernel per direction or AgentRefused: how the staged family asks
    whether a stage lowers (a stage is never staged again)."""
    return _lowered(spec, last=False)


def _lowered(spec, last: bool) -> dict:
    key = spec.hash()
    if key not in _programs:
        _programs[key] = _first_lowering(spec, last)
    return _programs[key]


def _first_lowering(spec, last: bool) -> dict:
    """The row lowering; where it refuses, the other families (families/), the row lowering's
    retries, then (`last`) the families tried last; else the row lowering's refusal."""
    try:
        return _row_programs(spec)
    except (AgentRefused, IRError) as stopped:  # a program its own invariants reject (IRError) is never a
        # kernel: refused with why
        refusal = stopped if isinstance(stopped, AgentRefused) else AgentRefused(
            f"{spec.path}: the builtin generator cannot lower this reference (its program fails an internal "
            f"check: {stopped}); use an LLM agent (--agent openai|anthropic|openai-compatible)")
    try:
        return lower_family(spec, refusal)
    except AgentRefused:
        pass
    try:
        return _row_retries(spec, refusal)
    except AgentRefused:
        if not last:
            raise
    return lower_family(spec, refusal, last=True)


# where the families refuse too, the row family once more, each way in turn:
ROW_RETRIES = (
    # a sum over every axis of element values taken as row sums then their sum (DyT's backward:
    # grad_x per element, its [D] weight's gradient over the rows and its scalar alpha's over
    # everything; held-out v8)
    {"totals_in_rows": True},
    # the rows of the output: an input read in pieces along a row dim (a GLU over channels,
    # [B, 2C, T] -> [B, C, T]; held-out v8's WaveNet gate)
    {"rows_of_output": True},
    # torch.max's indices over the columns as a second sweep (the axis family takes arg-reductions
    # it can; this is for those inside a row computation it refuses)
    {"indices_in_rows": True},
)


def _row_retries(spec, refusal: AgentRefused) -> dict:
    for options in ROW_RETRIES:
        try:
            return _row_programs(spec, **options)
        except (AgentRefused, IRError):
            continue
    raise refusal from None


def _row_programs(spec, totals_in_rows: bool = False, rows_of_output: bool = False,
                  indices_in_rows: bool = False) -> dict:
    """The row family's program of each direction, after the IR passes."""
    directions = ["forward"] + (["backward"] if spec.backward == "kernel" else [])
    programs = {d: run_passes(lower(trace(spec, d), totals_in_rows, rows_of_output, indices_in_rows), (negated_compares, row_broadcasts, cse,
                                                                      onehot_sums, lone_norms, centered_affine, cse))
                for d in directions}
    if spec.saved_values:  # its log-sum-exp shares log-softmax's sweep
        programs["forward"] = run_passes(programs["forward"], (shared_logsumexp, cse))
    if "backward" in programs:
        # the saved intermediates first: a saved row replaces a sweep, a forward output only bytes
        forward = programs["forward"]
        programs["backward"] = run_passes(programs["backward"], (
            functools.partial(reuse_saved_rows, spec, forward), cse,
            functools.partial(_with_forward_outputs, spec, forward)))
    return programs


def _streamed_fields(program) -> set[str]:
    """Tensors read as full rows (the bytes of a pass; [D] parameters stay in L2)."""
    return {n.attrs["field"] for n in program.nodes() if n.op == "load" and n.attrs.get("kind") == "elem"}


def _with_forward_outputs(spec, forward, backward):
    """The backward reading forward outputs where that replaces recomputation, kept only when
    it streams no more tensors than before (an output read on top of x would add bytes)."""
    outputs = {o.name for o in spec.signature.outputs if o.type.is_floating}
    reused = cse(reuse_forward_outputs(forward, backward, outputs))
    if scan_directions(backward) > 1 and scan_directions(reused) == 1:
        return reused  # the forward scan read back: one scan direction (logcumsumexp's backward)
    return reused if len(_streamed_fields(reused)) <= len(_streamed_fields(backward)) else backward


def build_source(spec, variant: Variant = DEFAULT_VARIANT) -> str:
    """The .cu text for `spec` (AgentRefused when the reference is outside the families)."""
    programs = lower_spec(spec)
    family = family_of(programs)
    if family is not None:  # a family's own emitter (of the variant's fields, it reads its own)
        return family.emit(spec, programs, variant)
    return emit_source(spec, programs, variant)


class BuiltinAgent(Agent):
    """Deterministic: it proposes its kernel once; asked again it has nothing new."""

    name = "builtin"
    model = None

    def __init__(self, variant: Variant = DEFAULT_VARIANT, **_ignored):
        self.variant = variant

    def propose(self, task: KernelTask, history: list[Attempt]) -> Candidate:
        if history:
            raise AgentExhausted("the builtin generator is deterministic: it has one kernel per spec "
                                 "(on a GPU, `specgen generate` autotunes its variants: agents/builtin/tune.py)")
        source = build_source(task.spec, self.variant)
        return Candidate(source=source, agent=self.name, model=None,
                         notes=f"builtin generator, schedule variant {self.variant.name}")


@dataclass
class GeneratedKernel:
    spec: object
    source: str
    variant: str
    kernel_path: Path | None = None  # specs/kernels/<op>.cu when written
    library: Path | None = None  # the compiled shared library
    verdicts: dict = field(default_factory=dict)  # variant -> Verdict (GPU only)
    timings: dict = field(default_factory=dict)  # variant -> median kernel us per benchmark row (GPU only)
    benchmark: object | None = None  # BenchResult of the kept variant (GPU only)
    record: object | None = None  # the lock Record written (GPU only)
    notes: list[str] = field(default_factory=list)


def compile_source(spec, source: str, *, arch: str | None = None):
    from ...toolchain import compile_kernel

    with tempfile.TemporaryDirectory(prefix="specgen-builtin-") as folder:
        abi.write_header(spec, folder)
        return compile_kernel(source, include_dirs=[Path(folder)], arch=arch, name=spec.name,
                              source_name=f"kernels/{spec.name}.cu")


def compile_many(jobs: list[tuple], unsigned_char: bool = False) -> list:
    """Compile (spec, source[, arch]) jobs at once (nvcc is single-threaded); each result is the
    compiled kernel or the exception its compile raised. The compile cache is keyed by
    content, so compiling one of these sources again is a cache hit. `unsigned_char`: each
    source's build with plain char unsigned too, the one verify_kernel runs (verify/char_abi.py),
    so the verifications after it find it cached instead of compiling it one at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        try:
            compiled = compile_source(job[0], job[1], arch=job[2] if len(job) > 2 else None)
        except Exception as error:  # the caller decides: the tuner reports it per variant
            return error
        if unsigned_char:
            from ...verify.char_abi import build_unsigned_char

            try:
                build_unsigned_char(job[0], job[1], arch=compiled.arch)
            except Exception:  # noqa: BLE001 - the verification compiles it again and reports it
                pass
        return compiled

    with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        return list(pool.map(one, jobs))


def shape_class_of(spec, direction: str, dims: dict, dtype: str, variant: Variant = DEFAULT_VARIANT,
                   sms: int = H200_SMS) -> str:
    """flat | few | narrow | medium | wide | split: the schedule class `variant`'s host code picks
    for one benchmark shape on a GPU of `sms` SMs (a Python mirror of the generated dispatch)."""
    from .emit import DirectionEmitter
    from .schedule import few_rows_tpr, items_max, plan, shape_class

    program = lower_spec(spec).get(direction)
    if program is None or family_of({direction: program}) is not None:
        return "medium"
    from .families import flat

    if flat.plan_of(program) is not None:
        return "flat"
    width = program.width.attrs["dim"].resolve(dims) if program.width.op == "dim" else program.width_example
    if program.fold > 1:  # the product of the folded trailing dims (lower.trailing_fold)
        width = _size_at(program.width, dims)
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[dtype]
    vec = max(1, 16 // itemsize)
    if width % vec:
        return "wide" if width > 32 else "narrow"
    emitter = DirectionEmitter(spec, program, direction, variant)
    imax = items_max(variant, emitter.words_per_item(itemsize, vec))
    tpr, items = plan(variant, width // vec, imax, split=emitter.split_allowed(variant))
    rows = math.prod(d.resolve(dims) for d in program.row_dims)
    if emitter.few_allowed(variant) and few_rows_tpr(variant, rows, width // vec, sms, row_free=emitter.row_free(),
                                                     plain_elems=items * vec, imax=imax) is not None:
        return "few"
    return shape_class(tpr, items)


def few_wide_rows(spec, sms: int = H200_SMS) -> bool:
    """Whether some benchmark row of `spec` is wide (looped) with at most two rows a SM: the
    rows the `loopcl` variant spreads over clusters (the host's gate); elsewhere its kernel
    runs as the default's, so the tuner need not time it."""
    programs = lower_spec(spec)
    for direction, program in programs.items():
        if family_of({direction: program}) is not None:
            continue
        for dims in spec.benchmark:
            rows = math.prod(d.resolve(dict(dims)) for d in program.row_dims)
            if rows <= 2 * sms and any(shape_class_of(spec, direction, dict(dims), dtype, sms=sms) == "wide"
                                       for dtype in spec.dtypes):
                return True
    return False


def _size_at(node, dims: dict) -> int:
    """A size node (a dim, a literal, or a product of them: a folded width) at `dims`."""
    if node.op == "dim":
        return node.attrs["dim"].resolve(dims)
    if node.op == "const":
        return int(node.attrs["value"])
    if node.op == "mul":
        return math.prod(_size_at(a, dims) for a in node.args)
    raise AssertionError(f"not a size: {node!r}")


def generate_builtin(spec, *, gpu: bool | None = None, write: bool = True, regenerate: bool = False,
                     tune: bool = True, bench: bool = True, examples: int | None = None,
                     variants: list[Variant] | None = None, timing_spec=None,
                     tune_budget_s: float = math.inf) -> GeneratedKernel:
    """Generate, compile and (with a GPU) verify, autotune and benchmark the kernel of `spec`,
    then write `specs/kernels/<op>.cu` and its lock entry (benchmarks/builtin_bench.py's entry
    point). Autotuning is the user path's tuner (tune.py), by default without a time budget: every variant
    of `variants` (default: all) verified and timed, or the default alone when not `tune`; the
    kernel is kept even where the tuner would keep eager (the note says so), and the tuning
    record goes into the lock only when it ships the kernel. Without a GPU: the default
    variant, compiled, no verification record. Raises AgentRefused outside the families,
    CompileError/Rejected when no variant compiles and verifies, LockError on a hand edit.
    `timing_spec`: the tuner times the variants at its benchmark shapes (tune.tune);
    `tune_budget_s`: the tuner's time budget (`specgen generate`'s default is tune.DEFAULT_BUDGET_S)."""
    from ... import lock
    from ...verify import VERIFIER_VERSION, gpu_available
    from .tune import KERNEL, GpuBackend
    from .tune import tune as run_tuner

    gpu = gpu_available() if gpu is None else gpu
    source = build_source(spec)  # refusals surface here, before any compile
    result = GeneratedKernel(spec, source, DEFAULT_VARIANT.name)
    records, tuning = [], None
    if not gpu:
        compiled = compile_source(spec, source)
        result.library = compiled.library
        result.notes.append("no GPU: the default variant was compiled, not verified (no verification record)")
    else:
        backend = GpuBackend(examples=examples, final_benchmark=False)
        tuned = run_tuner(spec, backend, budget_s=tune_budget_s,
                          variants=(variants or VARIANTS) if tune else [DEFAULT_VARIANT], timing_spec=timing_spec)
        result.verdicts = dict(backend.verdicts)
        result.timings = {name: [row["kernel_us"] for row in v["rows"]]
                          for name, v in tuned.record["variants"].items() if v.get("rows")}
        result.notes += tuned.notes + ([tuned.record["reason"]] if tuned.decision != KERNEL else [])
        tuning = tuned.record if tuned.decision == KERNEL else None
        compiled = compile_source(spec, tuned.source)
        result.source, result.variant, result.library = tuned.source, tuned.variant, compiled.library
        benchmark = None
        if bench and spec.benchmark:
            from ...bench import bench_spec

            benchmark = bench_spec(spec, compiled.library)
            result.benchmark = benchmark
        verdict = backend.verdicts_by_source[tuned.source]
        record = lock.Record(kernel_hash=lock.kernel_hash(result.source), verifier_version=VERIFIER_VERSION,
                             gpu_arch=compiled.arch, verification=_verification(spec, verdict, tuned.variant),
                             benchmark=benchmark.as_record() if benchmark else None)
        result.record = record
        records.append(record)
    if write:
        result.kernel_path = lock.write_kernel(spec, result.source, agent="builtin", model=None, records=records,
                                               regenerate=regenerate, tuning=tuning)
    return result


def _verification(spec, verdict, variant: str) -> dict:
    return {"passed": verdict.passed, "reason": verdict.reason, "examples": verdict.cases,
            "dtypes": list(spec.dtypes), "directions": ["forward"] + (["backward"] if spec.backward == "kernel"
                                                                      else []),
            "tolerance": verdict.tolerances, "variant": variant, "timings": verdict.timings}
