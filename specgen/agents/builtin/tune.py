"""Autotuning of the builtin generator in the user's path (`specgen generate`, `specgen build`).

    backend = make_backend(arch=None)            # None without a GPU: no tuning, the loop's default variant
    result = tune(spec, backend, budget_s=240)   # TuneResult: the chosen variant, the keep-eager decision
    result.record                                # what the lock keeps (LockEntry.tuning)

The tuner tries the schedule variants (schedule.VARIANTS) that give this spec a distinct
kernel and can matter at its benchmark shapes, default first, each one timed at every
benchmark row (both directions, in its sandbox) inside a time budget per spec; then it
verifies (`verify_kernel`) the fastest first, and only the variants that could still be
chosen: verifying at the full benchmark sizes costs more than timing (four variants of a
10^9-element op spent 307 s, session 21). No variant is chosen unverified. Per shape class
it keeps the fastest verified variant and combines the winners (schedule.combine), timed
and verified again. Eager PyTorch is timed once at the same rows.
The kernel ships only when it is not slower than eager beyond the noise (EAGER_NOISE_RATIO)
on any row; otherwise the op keeps its reference path (docs/ARCHITECTURE.md "Autotuning").

Everything that needs a GPU goes through `TuneBackend` (verify one source, time one source,
time eager, benchmark the chosen kernel for its lock record): `GpuBackend` is the real one;
tests pass their own with deterministic numbers, so the budget, the choice, the keep-eager
decision, the lock record and the reuse run on a CPU. The record carries its key (spec
hash, generator fingerprint, GPU arch, verifier version): the same key means the tuning is
reused and nothing runs on the GPU; any change re-tunes.
"""
from __future__ import annotations

import hashlib
import math
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ...errors import Rejected
from ..base import EAGER_NOISE_RATIO
from .schedule import CLASS_FIELDS, DEFAULT_VARIANT, VARIANTS, Variant, combine, combined_parts

REASON_CHARS = 1200  # a failed variant's reason as kept: the verdict, its detail and counterexample
DEFAULT_BUDGET_S = 240.0  # per spec: verification and timing of the variants (compiles included)
TIMING_REPS = 20  # timed calls per row and variant (the bench's median)
# A variant displaces one tried before it (the default first) only when faster than this ratio:
# two variants that give the timed rows the same launches differ by noise alone, and noise picked
# `flat1w64` over the default for held-out hardswish, timed at decode sizes only (its 12.9 GB row
# was too large to verify), where the two grids are the same; at 12.9 GB it ran at 96% of x.neg()'s
# bandwidth, the default's grid at 100% (session 17).
TIE_RATIO = 0.98
KERNEL, REFERENCE = "kernel", "reference"  # the decision


# ---------------------------------------------------------------------------- the key

_fingerprint: str | None = None


def generator_fingerprint() -> str:
    """sha256 of specgen's version and every source file of the builtin generator: a change
    to the generator (a new lowering, an emitter fix, a new variant) re-tunes every op."""
    global _fingerprint
    if _fingerprint is None:
        from ... import __version__

        digest = hashlib.sha256(f"specgen {__version__}\n".encode())
        folder = Path(__file__).resolve().parent
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".cuh", ".h", ".cu"):
                digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        _fingerprint = digest.hexdigest()[:16]
    return _fingerprint


def tuning_key(spec, gpu_arch: str) -> dict:
    """What a tuning result depends on; the lock's record is reused only under the same key."""
    from ...verify import VERIFIER_VERSION

    return {"spec_hash": spec.hash(), "generator": generator_fingerprint(), "gpu_arch": gpu_arch,
            "verifier_version": str(VERIFIER_VERSION)}


def reusable(entry, key: dict) -> bool:
    """Whether the lock entry's tuning record was made under `key` (then nothing is re-run)."""
    tuning = getattr(entry, "tuning", None) if entry is not None else None
    return bool(tuning) and tuning.get("key") == key


def key_changes(entry, key: dict) -> list[str]:
    """What differs between the entry's tuning key and `key`, in words (for the console)."""
    old = ((getattr(entry, "tuning", None) or {}).get("key")) or {}
    if not old:
        return ["no tuning record"]
    names = {"spec_hash": "the spec", "generator": "the generator", "gpu_arch": "the GPU arch",
             "verifier_version": "the verifier version"}
    return [f"{names.get(k, k)} changed ({old.get(k)} -> {v})" for k, v in key.items() if old.get(k) != v]


# ---------------------------------------------------------------------------- the backend

@dataclass
class Check:
    """One variant's verification: passed, why not, and the verifier's record for the lock."""

    passed: bool
    reason: str = ""
    record: dict | None = None


class TuneBackend(ABC):
    """The GPU-dependent half of tuning. Rows are dicts with direction, dtype, dims and
    kernel_us (time_kernel) or eager_us (time_eager), one per benchmark row."""

    arch: str = "unknown"  # the GPU architecture the results are valid for (part of the key)

    def prepare(self, spec, sources: list[str]) -> None:
        """Called once with every source to be tried (the real backend compiles them in parallel)."""

    @abstractmethod
    def verify(self, spec, source: str) -> Check: ...

    @abstractmethod
    def time_kernel(self, spec, source: str) -> list[dict]:
        """Kernel times per benchmark row; Rejected when a timed output or time was impossible."""

    @abstractmethod
    def time_eager(self, spec) -> list[dict]: ...

    def benchmark(self, spec, source: str) -> dict | None:
        """The chosen kernel's benchmark record for the lock (eager and torch.compile beside it)."""
        return None

    def sanitize_chosen(self, spec, source: str) -> dict | None:
        """compute-sanitizer over the chosen kernel before it is locked: per-tool seconds, None
        when it cannot run here; raises verify's Failure on a finding."""
        return None


def directions(spec) -> tuple[str, ...]:
    return ("forward", "backward") if spec.backward == "kernel" else ("forward",)


class GpuBackend(TuneBackend):
    """The real backend: the verifier, specgen.bench's timing (each kernel in its sandbox)."""

    def __init__(self, arch: str | None = None, *, sanitize: bool = False, examples: int | None = None,
                 reps: int = TIMING_REPS, final_benchmark: bool = True):
        from ...toolchain import detect_gpu_arch

        self.arch_option = arch  # None: the visible GPU
        self.arch = arch or detect_gpu_arch() or "unknown"
        self.sanitize, self.examples, self.reps, self.final_benchmark = sanitize, examples, reps, final_benchmark
        self.verdicts: dict[str, object] = {}  # variant name -> the verifier's Verdict (builtin_bench reports them)
        self.verdicts_by_source: dict[str, object] = {}  # kernel source -> its Verdict

    def _library(self, spec, source: str):
        from .generator import compile_source

        return compile_source(spec, source, arch=self.arch_option).library  # cached by content

    def prepare(self, spec, sources: list[str]) -> None:
        from .generator import compile_many

        if len(sources) > 1:
            compile_many([(spec, s, self.arch_option) for s in sources], unsigned_char=True)

    def verify(self, spec, source: str) -> Check:
        from ...verify import verify_kernel
        from ..evaluate import _reason, _record

        options = {"examples": self.examples} if self.examples else {}
        verdict = verify_kernel(spec, source, arch=self.arch_option, sanitize=self.sanitize, **options)
        name = re.search(r"// Schedule variant: (\S+)\.", source)
        self.verdicts[name.group(1) if name else "?"] = verdict
        self.verdicts_by_source[source] = verdict  # families without the marker line (arg-reductions, losses...)
        if not verdict.passed:  # the counterexample goes with the reason: a user can act on it
            counterexample = getattr(verdict, "counterexample", None)
            example = counterexample.describe() if counterexample is not None else ""
            return Check(False, (_reason(verdict) or "failed verification")
                         + (f"; counterexample: {example}" if example else ""))
        return Check(True, "", {**(_record(verdict) or {"passed": True}), "sanitized": self.sanitize})

    def sanitize_chosen(self, spec, source: str) -> dict | None:
        from ...verify.sanitize import sanitize_before_lock

        return sanitize_before_lock(spec, self._library(spec, source))

    def time_kernel(self, spec, source: str) -> list[dict]:
        from ...bench import bench_spec

        result = bench_spec(spec, self._library(spec, source), eager=False, compiled=False, reps=self.reps,
                            directions=directions(spec))
        if result.rejected:
            raise Rejected("the benchmark rejected the kernel: " + "; ".join(result.rejected)[:1000])
        return [{"direction": r.direction, "dtype": r.dtype, "dims": dict(r.dims), "kernel_us": r.kernel_us}
                for r in result.rows]

    def time_eager(self, spec) -> list[dict]:
        from ...bench import bench_spec

        result = bench_spec(spec, None, eager=True, compiled=False, reps=self.reps, directions=directions(spec))
        return [{"direction": r.direction, "dtype": r.dtype, "dims": dict(r.dims), "eager_us": r.eager_us}
                for r in result.rows]

    def benchmark(self, spec, source: str) -> dict | None:
        if not self.final_benchmark or not spec.benchmark:
            return None
        from ...bench import benchmark_kernel

        result = benchmark_kernel(spec, self._library(spec, source))
        if result.rejected:
            raise Rejected("the benchmark rejected the kernel: " + "; ".join(result.rejected)[:1000])
        return result.as_record()


def make_backend(arch: str | None = None, *, sanitize: bool = False) -> TuneBackend | None:
    """The real backend on a machine with a GPU; None without one (nothing is tuned there)."""
    from ...lock import gpu_available

    return GpuBackend(arch, sanitize=sanitize) if gpu_available() else None


# ---------------------------------------------------------------------------- the tuner

@dataclass
class TuneResult:
    variant: str
    source: str
    decision: str  # KERNEL | REFERENCE
    verification: dict | None  # the chosen variant's verifier record
    benchmark: dict | None  # the chosen kernel's benchmark record (KERNEL only)
    record: dict  # the lock's tuning record
    notes: list[str] = field(default_factory=list)

    @property
    def slower_rows(self) -> list[dict]:
        return [r for r in self.record["rows"] if r.get("slower_than_eager")]


def row_id(row: dict) -> str:
    dims = ",".join(f"{k}={v}" for k, v in (row.get("dims") or {}).items())
    return f"{row.get('direction', 'forward')} {row.get('dtype')} {dims}"


def _geomean(values) -> float:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("inf")


def _same(text: str) -> str:
    return re.sub(r"// Schedule variant: \S+\.", "", text)


def slower_than_eager(kernel_us, eager_us) -> bool:
    """Clearly slower: eager / kernel below EAGER_NOISE_RATIO (unknown times are not slower)."""
    if not kernel_us or not eager_us:
        return False
    return eager_us / kernel_us < EAGER_NOISE_RATIO


def _round(us):
    return None if us is None else round(float(us), 3)


def _changed_classes(variant: Variant) -> set[str]:
    return {cls for cls, names in CLASS_FIELDS.items()
            if any(getattr(variant, n) != getattr(DEFAULT_VARIANT, n) for n in names)}


def _row_classes(spec, variant: Variant) -> set[str] | None:
    """The shape classes of the spec's benchmark rows under `variant` (None: unknown)."""
    from .generator import shape_class_of

    try:
        return {shape_class_of(spec, d, dict(dims), dtype, variant)
                for dims in spec.benchmark for dtype in spec.dtypes for d in directions(spec)}
    except Exception:  # noqa: BLE001 - a shape the mirror cannot place: try the variant
        return None


def recorded_variant(entry) -> str:
    """The variant the op's committed kernel was built from: its newest verification record's
    (a combination `cls:name+cls:name` as written), else the default's name."""
    records = [r for r in getattr(entry, "records", []) if r.verification and r.verification.get("variant")]
    return records[-1].verification["variant"] if records else DEFAULT_VARIANT.name


def _few_wide_rows(spec) -> bool:
    from .generator import few_wide_rows

    try:
        return few_wide_rows(spec)
    except Exception:  # noqa: BLE001 - a shape the mirror cannot place: try the variant
        return True


def previous_variants(entry) -> list[str]:
    """The variant names an earlier kernel of the op was built from (its tuning record or its
    verification records; a combination "medium:cl256+wide:loop1024" names cl256 and loop1024):
    tried right after the default, so a small budget still reaches last time's winners."""
    if entry is None:
        return []
    names = [(entry.tuning or {}).get("variant")] if getattr(entry, "tuning", None) else []
    names += [(r.verification or {}).get("variant") for r in getattr(entry, "records", [])]
    found = []
    for name in filter(None, names):
        for base in combined_parts(str(name)).values() or [str(name)]:
            if base not in found:
                found.append(base)
    return found


# Variants written for one program structure, measured there: tried right after the default (and
# the lock's previous winners), so a small budget reaches them before the VARIANTS order does. An
# axis program whose reduced block is trailing (I == 1: InstanceNorm, GroupNorm) took axisfusedmom
# (0.71-0.88 of the default's time) and axisfused (0.75x -> 1.05-1.17x eager) in sessions 23-25;
# with a 60 s budget held-out problems-v7's InstanceNorm reached neither and kept the reference
# path at 0.63x eager (session 34). A reduced block with kept axes after it (I > 1) is what
# axiselemvec and axistree were written for (held-out argmin over channels chose axistree); a loss
# reduced to a scalar took axistree at 0.92x the default's time (log-cosh forward, session 34).
TRAILING_BLOCK_FIRST = ("axisfusedmom", "axisfused", "moments")
INNER_AXES_FIRST = ("axiselemvec", "axistree", "axisbatch")
EVERYTHING_FIRST = ("axisbatch", "axistree")  # a loss: its sweep's reads in flight first


def structure_first(spec) -> list[str]:
    """The variant names to try first for `spec`'s programs (empty: the VARIANTS order)."""
    from .families.axis_reduce import AxisProgram
    from .generator import lower_spec

    try:
        programs = list(lower_spec(spec).values())
    except Exception:  # noqa: BLE001 - a refusal is reported by build_source, not here
        return []
    layouts = [p.layout for p in programs if isinstance(p, AxisProgram) and p.layout is not None]
    if not layouts:
        return []
    if any(lay.lead and not lay.inner and not lay.ends for lay in layouts):  # kept lead, reduced trailing block
        return list(TRAILING_BLOCK_FIRST)
    if any(lay.inner and not lay.ends for lay in layouts):  # kept axes inside the reduced block's right
        return list(INNER_AXES_FIRST)
    return list(EVERYTHING_FIRST)  # everything reduced (a loss), or the ends around a kept block


def _fastest(names, time_of: Callable[[str], float]) -> str:
    """The first of `names` (in the order tried: the default first) within TIE_RATIO of the
    fastest: a later variant wins only by more than the noise."""
    names = list(names)
    fastest = min(time_of(n) for n in names)
    return next(n for n in names if fastest >= TIE_RATIO * time_of(n))


def candidates(spec, variants: list[Variant] | None = None, prefer: list[str] = (), *,
               every_class: bool = False, timed=None) -> tuple[list[tuple[Variant, str]], list[str]]:
    """(variant, source) pairs worth trying, default first, then `prefer`: one per distinct
    kernel text, and only variants that change a field of a shape class some benchmark row is
    in (under the default or under the variant itself: a field can move rows between classes).
    `every_class`: no such filter (the verifier's sizes reach every class: a variant that cannot
    speed up a benchmark row can still be the one that verifies). `timed`: the spec whose
    benchmark rows are timed (default `spec`)."""
    from .generator import build_source

    timed = timed or spec
    variants = list(variants or VARIANTS)
    order = list(dict.fromkeys([DEFAULT_VARIANT.name, *prefer, *structure_first(spec)]))
    variants.sort(key=lambda v: order.index(v.name) if v.name in order else len(order))
    default_classes = _row_classes(timed, DEFAULT_VARIANT) if timed.benchmark and not every_class else None
    pairs, seen, notes = [], set(), []
    for variant in variants:
        if variant.name != DEFAULT_VARIANT.name and default_classes is not None:
            own = _row_classes(timed, variant)
            if own is not None and not _changed_classes(variant) & (default_classes | own):
                notes.append(variant.name)
                continue
            if variant.loop_cluster > 1 and not variant.loop_stage and not _few_wide_rows(timed):  # gate shut
                notes.append(variant.name)
                continue
        source = build_source(spec, variant)
        if _same(source) in seen:
            continue
        seen.add(_same(source))
        pairs.append((variant, source))
    if notes:
        notes = [f"not tried: variant(s) {', '.join(notes)} change no shape class of the benchmark rows"]
    return pairs, notes


class _Tuning:
    def __init__(self, spec, backend: TuneBackend, budget_s: float, clock, say, timed=None):
        self.spec, self.backend, self.budget_s, self.clock, self.say = spec, backend, budget_s, clock, say
        self.timed = timed or spec  # the spec whose benchmark rows are timed
        self.started = clock()
        self.tried: dict[str, dict] = {}  # variant name -> its record
        self.passed: dict[str, tuple[Variant, str, Check]] = {}
        self.sources: dict[str, tuple[Variant, str]] = {}
        self.costs: list[float] = []  # seconds per timing
        self.verify_costs: list[float] = []  # seconds per verification
        self.notes: list[str] = []

    def elapsed(self) -> float:
        return self.clock() - self.started

    def over_budget(self, verifying: int = 0) -> bool:
        """Whether the next timing (estimated as the mean timing so far), and `verifying` more
        verifications (the mean verification so far), would end past the budget."""
        def mean(costs):
            return sum(costs) / len(costs) if costs else 0.0

        return self.elapsed() + mean(self.costs) + verifying * mean(self.verify_costs) > self.budget_s

    def time(self, variant: Variant, source: str) -> bool:
        """Time one variant at every benchmark row (in its sandbox; the bench rejects a wrong
        timed output). Verification comes after, fastest first (`verified`)."""
        began = self.clock()
        record: dict = {"verified": False}
        self.tried[variant.name] = record
        self.sources[variant.name] = (variant, source)
        try:
            rows = self.backend.time_kernel(self.timed, source)
            record["rows"] = [{"id": row_id(r), "kernel_us": _round(r.get("kernel_us"))} for r in rows]
            if rows and all(r["kernel_us"] for r in record["rows"]):
                record["geomean_us"] = _round(_geomean(r["kernel_us"] for r in record["rows"]))
            else:
                record["reason"] = "the benchmark gave no kernel time for some row"
        except (Rejected, RuntimeError) as error:  # a timed output was wrong, the library did not load
            record["reason"] = f"{type(error).__name__}: {error}"[:REASON_CHARS]
        record["seconds"] = round(self.clock() - began, 2)
        self.costs.append(self.clock() - began)
        if "geomean_us" in record:
            self.say(f"variant {variant.name}: {record['geomean_us']:.1f} us (geomean of {len(record['rows'])} rows)")
        else:
            self.say(f"variant {variant.name}: [not kept] {record.get('reason', '')[:200]}")
        return "geomean_us" in record

    def timed_names(self) -> list[str]:
        """Variants with a time at every row, in the order tried (the default first)."""
        return [n for n, r in self.tried.items() if "geomean_us" in r]

    def verified(self, name: str) -> bool:
        """Verify `name` once (cached). A variant that fails loses its timings: they mean nothing."""
        if name in self.passed:
            return True
        record = self.tried[name]
        if record.get("verified") is not False or "reason" in record or "geomean_us" not in record:
            return False
        began = self.clock()
        variant, source = self.sources[name]
        try:
            check = self.backend.verify(self.spec, source)
        except (Rejected, RuntimeError) as error:
            check = Check(False, f"{type(error).__name__}: {error}")
        record["seconds"] = round(record.get("seconds", 0) + self.clock() - began, 2)
        self.verify_costs.append(self.clock() - began)
        if check.passed:
            record["verified"] = True
            self.passed[name] = (variant, source, check)
            self.say(f"variant {name}: verified")
            return True
        record["reason"] = check.reason[:REASON_CHARS]
        for key in ("rows", "geomean_us"):
            record.pop(key, None)
        self.say(f"variant {name}: [not kept] {record['reason'][:200]}")
        return False

    def pick(self, names, time_of: Callable[[str], float]) -> str | None:
        """What `_fastest` picks among the verified ones of `names`, verifying only the variants
        that can change the pick: fastest first until one verifies, then those within TIE_RATIO
        of it (an earlier one among them keeps its place). None when none verifies."""
        times = {n: time_of(n) for n in names}  # read before verifying: a failure drops the times
        best = next((n for n in sorted(times, key=times.get) if self.verified(n)), None)
        if best is None:
            return None
        return next(n for n in times if times[n] * TIE_RATIO <= times[best] and self.verified(n))

    def note_unverified(self) -> None:
        """Timed variants the pick never needed: marked so, not counted as failures."""
        for name in self.timed_names():
            if name not in self.passed and self.tried[name].get("verified") is False:
                self.tried[name]["verification"] = "not needed: slower than the verified variant chosen"

    def attempt(self, variant: Variant, source: str) -> bool:
        """Time and verify one variant (the combination of the per-class winners)."""
        return self.time(variant, source) and self.verified(variant.name)

    def times(self, name: str) -> dict[str, float]:
        return {r["id"]: r["kernel_us"] for r in self.tried[name].get("rows", [])}


def tune(spec, backend: TuneBackend, *, budget_s: float = DEFAULT_BUDGET_S, variants: list[Variant] | None = None,
         clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] = lambda _: None,
         baseline: tuple[str, str] | None = None, prefer: list[str] = (), timing_spec=None) -> TuneResult:
    """Tune `spec` on `backend` within `budget_s` seconds (see the module docstring).
    `baseline`: (agent, source) of a locked kernel to beat (decision "baseline" when it is
    faster: the caller keeps it). `prefer`: variant names tried right after the default (see
    previous_variants). `timing_spec`: the same op with the benchmark shapes to time, where they
    differ from the ones verified (a harness that verifies without shapes too large for the
    verifier's checked timing still times them: a launch's difference may show only there).
    Raises Rejected when no variant verifies."""
    from .generator import build_source, shape_class_of

    timed = timing_spec or spec
    run = _Tuning(spec, backend, budget_s, clock, say, timed)
    if not timed.benchmark:  # nothing to time: the default variant, verified
        return _untimed(spec, backend, run)
    pairs, run.notes = candidates(spec, variants, prefer, timed=timed)
    backend.prepare(spec, [source for _, source in pairs])
    eager = {row_id(r): _round(r.get("eager_us")) for r in backend.time_eager(timed)}
    skipped = []
    for variant, source in pairs:  # timing first: verifying at full size costs more than timing
        if run.timed_names() and run.over_budget():  # the first timed kernel is found whatever the budget
            skipped.append(variant.name)
            run.tried[variant.name] = {"skipped": "time budget"}
            continue
        run.time(variant, source)
    geomean = lambda n: run.tried[n]["geomean_us"]  # noqa: E731
    best = run.pick(run.timed_names(), geomean)
    if best is None:  # the first verified kernel is found whatever the budget: the skipped ones,
        # then the variants set aside for speed (they cannot speed up a row, but may verify)
        rest = [(v, s) for v, s in pairs if v.name in skipped]
        tried = {_same(source) for _, source in pairs}
        extra = [(v, s) for v, s in candidates(spec, variants, prefer, every_class=True)[0] if _same(s) not in tried]
        if extra:
            backend.prepare(spec, [source for _, source in extra])
        for variant, source in rest + extra:
            skipped = [n for n in skipped if n != variant.name]
            if run.attempt(variant, source):
                best = variant.name
                break
        aside = [v.name for v, _ in extra if v.name in run.tried]
        if aside:
            run.notes.append(f"no variant that can speed up a benchmark row verified: tried "
                             f"{', '.join(aside)} for correctness")
    if skipped:
        run.notes.append(f"time budget of {budget_s:g} s: {len(skipped)} variant(s) not tried "
                         f"({', '.join(skipped)})")
    if best is None:
        first = next(iter(run.tried.values()), {})
        raise Rejected(f"{spec.path}: no builtin kernel variant passed verification: {first.get('reason', '')}")

    chosen = best
    timed_names = run.timed_names()
    if len(timed_names) > 1:  # per shape class: the fastest verified variant; one kernel of the winners
        per_class: dict[str, dict[str, list[float]]] = {}
        for name in timed_names:
            for row in run.tried[name]["rows"]:
                direction, dims, dtype = _parse_id(row["id"])
                cls = shape_class_of(spec, direction, dims, dtype)
                per_class.setdefault(cls, {}).setdefault(name, []).append(row["kernel_us"])
        fields = [f for names in CLASS_FIELDS.values() for f in names]

        def known(merged: Variant) -> bool:  # the combination is a variant already timed (it won or lost)
            return any(all(getattr(v, f) == getattr(merged, f) for f in fields) for v, _ in run.sources.values())

        # first by times alone: a combination that is a timed variant costs no verification
        by_time = {cls: run.sources[_fastest(by, lambda n: _geomean(by[n]))][0] for cls, by in per_class.items()}
        merged = combine(by_time)
        if not known(merged) and run.over_budget(verifying=len(per_class) + 1):
            run.notes.append(f"time budget: the combination {merged.name} of the per-class winners was not tried")
        elif not known(merged):  # the winners verified (fastest first per class), then their combination
            winners = {}
            for cls, by in per_class.items():
                name = run.pick(by, lambda n: _geomean(by[n]))  # (one that failed is never verified again)
                winners[cls] = run.passed[name][0] if name else run.passed[best][0]
            merged = combine(winners)
            if not known(merged):
                source = build_source(spec, merged)
                if _same(source) not in {_same(s) for _, s in run.sources.values()} and run.attempt(merged, source):
                    if run.tried[merged.name]["geomean_us"] <= run.tried[best]["geomean_us"]:
                        chosen = merged.name
                    else:
                        run.notes.append(f"combined variant {merged.name} is slower than {best} over all rows; "
                                         f"keeping {best}")

    def slower(name: str) -> list[str]:
        return [i for i, us in run.times(name).items() if slower_than_eager(us, eager.get(i))]

    if slower(chosen):  # never slower than eager first, speed second
        better = run.pick([n for n in run.timed_names() if not slower(n)], geomean)
        if better:
            run.notes.append(f"{chosen} is slower than eager on {len(slower(chosen))} row(s); {better} is not: "
                             f"choosing {better}")
            chosen = better
    run.note_unverified()
    variant, source, check = run.passed[chosen]
    kernel_times = run.times(chosen)
    if slower(chosen):  # before giving the op up to eager: both timed again, the best of two runs each
        again = {row_id(r): r.get("kernel_us") for r in backend.time_kernel(spec, source)}
        again_eager = {row_id(r): r.get("eager_us") for r in backend.time_eager(spec)}
        kernel_times = {i: min(filter(None, (us, again.get(i))), default=None) for i, us in kernel_times.items()}
        eager = {i: min(filter(None, (us, again_eager.get(i))), default=None) for i, us in eager.items()}
        run.notes.append(f"{chosen} was slower than eager on {len(slower(chosen))} row(s): both timed again, "
                         f"the best of two runs of each compared")
    rows = []
    for rid, kernel_us in kernel_times.items():
        eager_us = eager.get(rid)
        rows.append({"id": rid, "kernel_us": kernel_us, "eager_us": eager_us,
                     "speedup_vs_eager": round(eager_us / kernel_us, 4) if eager_us and kernel_us else None,
                     "slower_than_eager": slower_than_eager(kernel_us, eager_us)})
    decision = REFERENCE if any(r["slower_than_eager"] for r in rows) else KERNEL
    if baseline is not None and decision == KERNEL:
        rows_base = {row_id(r): r.get("kernel_us") for r in backend.time_kernel(spec, baseline[1])}
        base_us = _geomean(rows_base.values())
        mine_us = run.tried[chosen]["geomean_us"]
        run.notes.append(f"the locked kernel by {baseline[0]}: {base_us:.1f} us, the tuned builtin kernel "
                         f"{mine_us:.1f} us (geomean)")
        if base_us < mine_us:
            decision = "baseline"
    benchmark = None
    if decision == KERNEL:
        benchmark = backend.benchmark(spec, source)
    record = {"key": tuning_key(spec, backend.arch), "budget_s": _budget(budget_s), "spent_s": round(run.elapsed(), 2),
              "complete": not skipped, "variant": variant.name, "decision": decision,
              "noise_ratio": EAGER_NOISE_RATIO, "rows": rows, "variants": run.tried,
              "notes": run.notes}
    if decision == REFERENCE:
        record["reason"] = reference_reason(variant.name, rows)
    return TuneResult(variant.name, source, decision, check.record, benchmark, record, list(run.notes))


def _untimed(spec, backend: TuneBackend, run: _Tuning) -> TuneResult:
    from .generator import build_source

    source = build_source(spec, DEFAULT_VARIANT)
    check = backend.verify(spec, source)
    if not check.passed:
        raise Rejected(f"{spec.path}: the builtin kernel failed verification: {check.reason}")
    notes = ["the spec has no benchmark shapes: nothing to time or compare with eager; the default variant"]
    record = {"key": tuning_key(spec, backend.arch), "budget_s": _budget(run.budget_s),
              "spent_s": round(run.elapsed(), 2),
              "complete": True, "variant": DEFAULT_VARIANT.name, "decision": KERNEL,
              "noise_ratio": EAGER_NOISE_RATIO, "rows": [],
              "variants": {DEFAULT_VARIANT.name: {"verified": True, "rows": []}}, "notes": notes}
    return TuneResult(DEFAULT_VARIANT.name, source, KERNEL, check.record, None, record, notes)


def _budget(budget_s: float) -> float | None:
    """The budget as the lock keeps it: None for none (JSON has no infinity)."""
    return budget_s if math.isfinite(budget_s) else None


def _parse_id(rid: str) -> tuple[str, dict, str]:
    direction, dtype, dims = (rid.split(" ", 2) + ["", ""])[:3]
    parsed = {}
    for part in filter(None, dims.split(",")):
        name, _, value = part.partition("=")
        parsed[name] = int(value) if value.lstrip("-").isdigit() else value
    return direction, parsed, dtype


def reference_reason(variant: str, rows: list[dict]) -> str:
    slow = [r for r in rows if r.get("slower_than_eager")]
    worst = min(slow, key=lambda r: r["speedup_vs_eager"] or 1.0)
    return (f"the fastest verified builtin kernel (variant {variant}) is slower than eager PyTorch on "
            f"{len(slow)} of {len(rows)} benchmark rows (worst {worst['speedup_vs_eager']:.2f}x at "
            f"{worst['id']}); the package keeps the reference path")


def summary_lines(record: dict) -> list[str]:
    """What `specgen generate` prints about a tuning (fresh or reused)."""
    lines = []
    variants = record.get("variants", {})
    tried = [n for n, v in variants.items() if "skipped" not in v]
    verified = [n for n in tried if variants[n].get("verified")]
    timed_only = [n for n in tried if variants[n].get("verification")]  # slower: never needed verifying
    budget = record.get("budget_s")
    lines.append(f"tuned in {record.get('spent_s', 0):.0f} s " + (f"of a {budget:g} s budget" if budget else
                                                                  "(no budget)") + ": "
                 f"{len(tried)} variant(s): {len(verified)} verified, {len(timed_only)} timed only (slower), "
                 f"{len(tried) - len(verified) - len(timed_only)} not kept"
                 + ("" if record.get("complete", True) else ", budget reached before all were tried"))
    for name in tried:
        v = variants[name]
        if v.get("geomean_us"):
            lines.append(f"  {name}: {v['geomean_us']:.1f} us geomean" + ("" if v.get("verified") else " (not verified)"))
        elif v.get("verified") and not v.get("reason"):
            lines.append(f"  {name}: verified, not timed (no benchmark shapes)")
        else:
            lines.append(f"  {name}: not kept ({v.get('reason', '')[:120]})")
    rows = record.get("rows", [])
    ratios = [r["speedup_vs_eager"] for r in rows if r.get("speedup_vs_eager")]
    lines.append(f"chosen: variant {record.get('variant')}" + (
        f": {min(ratios):.2f}x-{max(ratios):.2f}x eager over {len(rows)} rows (geomean {_geomean(ratios):.2f}x)"
        if ratios else ""))
    if len(rows) > 8:  # the slower rows and the three closest to eager; all of them are in the lock
        by_ratio = sorted(rows, key=lambda r: r.get("speedup_vs_eager") or float("inf"))
        rows = [r for r in by_ratio if r.get("slower_than_eager")] or by_ratio[:3]
        lines.append("  " + ("rows slower than eager:" if rows[0].get("slower_than_eager") else
                             "closest to eager:"))
    for row in rows:
        ratio = row.get("speedup_vs_eager")
        lines.append(f"  {row['id']}: {row['kernel_us']:.1f} us, eager {row.get('eager_us') or 0:.1f} us"
                     + (f" ({ratio:.2f}x)" if ratio else "") + (" SLOWER than eager" if row.get("slower_than_eager")
                                                                 else ""))
    decision = record.get("decision")
    if decision == REFERENCE:
        lines.append("decision: keep the reference path (eager) - " + record.get("reason", ""))
    elif decision == "baseline":
        lines.append("decision: keep the locked kernel (it is faster)")
    else:
        lines.append("decision: ship the kernel (not slower than eager on any row beyond noise)")
    return lines
