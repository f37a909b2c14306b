"""The builtin agent and the whole builtin flow: trace -> lower -> emit -> compile ->
(on a GPU: verify + autotune + benchmark) -> lock.

    from specgen.agents.builtin import generate_builtin
    result = generate_builtin(spec, gpu=None)   # None: use the GPU when there is one
"""
from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ... import abi
from ...errors import Rejected
from ..base import Agent, AgentExhausted, AgentRefused, Attempt, Candidate, KernelTask
from .emit import emit_source
from .families import family_of, lower_family
from .schedule import CLASS_FIELDS, DEFAULT_VARIANT, VARIANTS, Variant, combine
from .lower import lower
from .optimize import cse, onehot_sums, reuse_forward_outputs
from .trace import trace

_programs: dict[str, dict] = {}


def lower_spec(spec) -> dict:
    """The row program of each direction the spec asks a kernel for (cached per spec hash)."""
    key = spec.hash()
    if key not in _programs:
        try:
            directions = ["forward"] + (["backward"] if spec.backward == "kernel" else [])
            programs = {d: cse(onehot_sums(cse(lower(trace(spec, d))))) for d in directions}
            if "backward" in programs:
                programs["backward"] = _with_forward_outputs(spec, programs["forward"], programs["backward"])
        except AgentRefused as refusal:  # outside the row family: the other families (families/), or this refusal
            programs = lower_family(spec, refusal)
        _programs[key] = programs
    return _programs[key]


def _streamed_fields(program) -> set[str]:
    """Tensors read as full rows (the bytes of a pass; [D] parameters stay in L2)."""
    return {n.attrs["field"] for n in program.nodes() if n.op == "load" and n.attrs.get("kind") == "elem"}


def _with_forward_outputs(spec, forward, backward):
    """The backward reading forward outputs where that replaces recomputation, kept only when
    it streams no more tensors than before (an output read on top of x would add bytes)."""
    outputs = {o.name for o in spec.signature.outputs if o.type.is_floating}
    reused = cse(reuse_forward_outputs(forward, backward, outputs))
    return reused if len(_streamed_fields(reused)) <= len(_streamed_fields(backward)) else backward


def build_source(spec, variant: Variant = DEFAULT_VARIANT) -> str:
    """The .cu text for `spec` (AgentRefused when the reference is outside the families)."""
    programs = lower_spec(spec)
    family = family_of(programs)
    if family is not None:  # a family's own emitter (one schedule: the variant does not apply)
        return family.emit(spec, programs)
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
                                 "(autotuning happens in generate_builtin on a GPU)")
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


def compile_many(jobs: list[tuple]) -> list:
    """Compile (spec, source) pairs at once (nvcc is single-threaded); each result is the
    compiled kernel or the exception its compile raised. The compile cache is keyed by
    content, so compiling one of these sources again is a cache hit."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        try:
            return compile_source(*job)
        except Exception as error:  # the caller decides: autotune reports it per variant
            return error

    with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        return list(pool.map(one, jobs))


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("inf")


def shape_class_of(spec, direction: str, dims: dict, dtype: str) -> str:
    """narrow | medium | wide: the schedule class the default variant's host code picks for
    one benchmark shape (a Python mirror of the generated dispatch)."""
    from .emit import DirectionEmitter
    from .schedule import items_max, plan, shape_class

    program = lower_spec(spec).get(direction)
    if program is None or family_of({direction: program}) is not None:
        return "medium"
    width = program.width.attrs["dim"].resolve(dims) if program.width.op == "dim" else program.width_example
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[dtype]
    vec = max(1, 16 // itemsize)
    if width % vec:
        return "wide" if width > 32 else "narrow"
    emitter = DirectionEmitter(spec, program, direction)
    imax = items_max(DEFAULT_VARIANT, emitter.words_per_item(itemsize, vec))
    return shape_class(*plan(DEFAULT_VARIANT, width // vec, imax, split=emitter.split_allowed(DEFAULT_VARIANT)))


def _directions(spec) -> tuple[str, ...]:
    return ("forward", "backward") if spec.backward == "kernel" else ("forward",)


def autotune(spec, variants: list[Variant], *, examples: int | None = None, result: GeneratedKernel):
    """Verify each variant and time it at the spec's benchmark shapes (both directions); per
    shape class (narrow / medium / wide rows) keep the variant with the best geometric mean,
    and combine the winners into one kernel (each class's schedule fields from its winner),
    verified and timed again: kept only if it is not slower over all rows than the best single
    variant (a variant can move rows between classes: csmem takes LayerNorm's wide rows into
    registers through a medium-class field). GPU only. Returns (variant, source, compiled, verdict)."""
    from ...verify import verify_kernel

    passed = {}
    per_class: dict[str, dict[str, list[float]]] = {}
    sources, seen = {}, set()
    for v in variants:  # variants giving this spec the same source are one candidate
        text = build_source(spec, v)
        same = re.sub(r"// Schedule variant: \S+\.", "", text)
        if same not in seen:
            seen.add(same)
            sources[v.name] = text
    variants = [v for v in variants if v.name in sources]
    if len(variants) > 1:
        compile_many([(spec, source) for source in sources.values()])
    for variant in variants:
        source = sources[variant.name]
        compiled = compile_source(spec, source)  # a cache hit after compile_many; raises its error
        verdict = verify_kernel(spec, source, **({"examples": examples} if examples else {}))
        result.verdicts[variant.name] = verdict
        if not verdict.passed:
            result.notes.append(f"variant {variant.name} failed verification: {verdict.summary()}")
            continue
        passed[variant.name] = (variant, source, compiled, verdict)
        if len(variants) == 1:
            return variant, source, compiled, verdict
        timing = _time(spec, compiled, variant, result)
        for row in timing.rows:
            if row.kernel_us:
                cls = shape_class_of(spec, row.direction, row.dims, row.dtype)
                per_class.setdefault(cls, {}).setdefault(variant.name, []).append(row.kernel_us)
    if not passed:
        first = next(iter(result.verdicts.values()))
        raise Rejected(f"{spec.path}: no builtin kernel variant passed verification:\n{first.summary()}")
    overall = min(passed.values(), key=lambda c: _geomean(result.timings.get(c[0].name, [])))
    winners = {}
    for cls, by_variant in per_class.items():
        best = min((name for name in by_variant if name in passed), key=lambda n: _geomean(by_variant[n]))
        winners[cls] = passed[best][0]
        result.notes.append(f"{cls} rows: variant {best} fastest "
                            + ", ".join(f"{n} {_geomean(t):.1f} us" for n, t in sorted(by_variant.items())))
    chosen = combine(winners)
    if all(getattr(chosen, f) == getattr(overall[0], f) for fields in CLASS_FIELDS.values() for f in fields):
        return overall
    source = build_source(spec, chosen)
    compiled = compile_source(spec, source)
    verdict = verify_kernel(spec, source, **({"examples": examples} if examples else {}))
    result.verdicts[chosen.name] = verdict
    if not verdict.passed:
        result.notes.append(f"combined variant {chosen.name} failed verification: {verdict.summary()}; "
                            f"keeping {overall[0].name}")
        return overall
    _time(spec, compiled, chosen, result)
    combined_us, best_us = _geomean(result.timings[chosen.name]), _geomean(result.timings[overall[0].name])
    if combined_us > best_us:
        result.notes.append(f"combined variant {chosen.name} ({combined_us:.1f} us) is slower than "
                            f"{overall[0].name} ({best_us:.1f} us) over all rows; keeping {overall[0].name}")
        return overall
    return chosen, source, compiled, verdict


def _time(spec, compiled, variant: Variant, result: GeneratedKernel):
    """Kernel times of one variant at the benchmark shapes, recorded in result.timings."""
    from ...bench import bench_spec

    timing = bench_spec(spec, compiled.library, eager=False, compiled=False, reps=20, directions=_directions(spec))
    result.timings[variant.name] = [row.kernel_us for row in timing.rows if row.kernel_us]
    return timing


def generate_builtin(spec, *, gpu: bool | None = None, write: bool = True, regenerate: bool = False,
                     tune: bool = True, bench: bool = True, examples: int | None = None,
                     variants: list[Variant] | None = None) -> GeneratedKernel:
    """Generate, compile and (with a GPU) verify, autotune and benchmark the kernel of `spec`,
    then write `specs/kernels/<op>.cu` and its lock entry. Without a GPU: the default
    variant, compiled, no verification record. Raises AgentRefused outside the families,
    CompileError/Rejected when no variant compiles and verifies, LockError on a hand edit."""
    from ... import lock
    from ...verify import VERIFIER_VERSION, gpu_available

    gpu = gpu_available() if gpu is None else gpu
    source = build_source(spec)  # refusals surface here, before any compile
    result = GeneratedKernel(spec, source, DEFAULT_VARIANT.name)
    records = []
    if not gpu:
        compiled = compile_source(spec, source)
        result.library = compiled.library
        result.notes.append("no GPU: the default variant was compiled, not verified (no verification record)")
    else:
        candidates = (variants or VARIANTS) if tune else [DEFAULT_VARIANT]
        variant, source, compiled, verdict = autotune(spec, candidates,
                                                      examples=examples, result=result)
        result.source, result.variant, result.library = source, variant.name, compiled.library
        benchmark = None
        if bench and spec.benchmark:
            from ...bench import bench_spec

            benchmark = bench_spec(spec, compiled.library)
            result.benchmark = benchmark
        record = lock.Record(kernel_hash=lock.kernel_hash(source), verifier_version=VERIFIER_VERSION,
                             gpu_arch=compiled.arch, verification=_verification(spec, verdict, variant),
                             benchmark=benchmark.as_record() if benchmark else None)
        result.record = record
        records.append(record)
    if write:
        result.kernel_path = lock.write_kernel(spec, result.source, agent="builtin", model=None, records=records,
                                               regenerate=regenerate)
    return result


def _verification(spec, verdict, variant: Variant) -> dict:
    return {"passed": verdict.passed, "reason": verdict.reason, "examples": verdict.cases,
            "dtypes": list(spec.dtypes), "directions": ["forward"] + (["backward"] if spec.backward == "kernel"
                                                                      else []),
            "tolerance": verdict.tolerances, "variant": variant.name, "timings": verdict.timings}
