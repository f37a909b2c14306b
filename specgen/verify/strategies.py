"""What the verifier runs a kernel on: cases (dims, dtype, value distribution, seed, offset).

Two sources, both capped by a memory budget so a case stays quick:
- `boundary_cases`: sizes where kernels break, always run (1, 31/32/33, vector widths and
  block sizes +-1, odd sizes, the smallest and the largest allowed);
- `case_strategy`: a Hypothesis strategy over the spec's whole ranges (log-uniform sizes,
  every declared dtype, every value distribution, offset input views) that shrinks a
  failing case towards small sizes.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from hypothesis import strategies as st

from ..inputs import identity_inputs
from .domain import Domain

# Elements over all tensors of one case (inputs + outputs, forward and backward alike): small
# enough that drawing the inputs (on the CPU, shared with `specgen check`) stays ~10 ms.
DEFAULT_BUDGET_ELEMENTS = 1 << 20
LARGE_CASE_FACTOR = 4  # the one large case (races between blocks, atomics) may use 4x the budget
# Sizes where vectorised or blocked kernels go wrong: lane/warp/vector widths and common
# block sizes, each with its neighbours.
_EDGES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257,
          511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193)
# Odd sizes with no power-of-two structure at all.
_ODD = (37, 97, 331, 1531, 3001, 7919)
# Input views start this many elements into their storage: with 2-, 4- and 8-byte elements
# these make pointers aligned to 16, 8, 4 and 2 bytes (a kernel that checks 8-byte alignment and
# then loads 16 bytes meets an 8-byte aligned pointer). Each further input starts one element
# later than the one before (input_offset), so inputs of one case differ in alignment too.
ELEMENT_OFFSETS = (0, 1, 2, 3, 4)


def input_offset(offset: int, index: int) -> int:
    """The element offset of the case's `index`-th input view (0: every input aligned)."""
    return offset + index if offset else 0


@dataclass(frozen=True)
class Case:
    dims: tuple[tuple[str, int], ...]  # ordered (symbol, size) pairs: hashable
    dtype: str
    distribution: str = "normal"
    seed: int = 0
    offset: int = 0  # elements, of the first input (input_offset: the others one more each)
    scalars: tuple[tuple[str, float | int | bool], ...] = ()  # drawn scalar values; absent: defaults
    overrides: tuple[tuple[str, str], ...] = ()  # (input, class) drawn instead (verify/domain.py)
    # the output gradients' class in a backward case ("" = the inputs' class): NaN/inf gradients
    # over finite activations are an AMP overflow step's, loss-scaled ones ("large") a scaler's
    gradients: str = ""

    @property
    def dim_map(self) -> dict[str, int]:
        return dict(self.dims)

    def describe(self) -> str:
        shape = " ".join(f"{k}={v}" for k, v in self.dims)
        view = (f", inputs offset by {self.offset}, {self.offset + 1}, ... element(s) (one more each)"
                if self.offset else "")
        scalars = "".join(f", {k}={v:.4g}" if isinstance(v, float) else f", {k}={v}" for k, v in self.scalars)
        instead = f" ({', '.join(f'{k}: {v}' for k, v in self.overrides)} values)" if self.overrides else ""
        grads = f", {self.gradients} output gradients" if self.gradients else ""
        return f"{shape} {self.dtype}, {self.distribution} values{instead}{grads}, seed {self.seed}{view}{scalars}"

    @property
    def gradient_class(self) -> str:
        return self.gradients or self.distribution

    def to_json(self) -> dict:
        data = asdict(self)
        data["dims"] = dict(self.dims)
        data["scalars"] = dict(self.scalars)
        if self.overrides:
            data["overrides"] = dict(self.overrides)
        else:
            del data["overrides"]
        if not self.gradients:
            del data["gradients"]
        return data


def make_case(dims: dict[str, int], dtype: str, **kw) -> Case:
    return Case(tuple(dims.items()), dtype, **kw)


# ------------------------------------------------------------------ sizes and the budget

def legal_sizes(lo: int, hi: int, step: int, wanted) -> list[int]:
    """`wanted` sizes rounded to multiples of `step` and kept within [lo, hi], in order, unique."""
    first = -(-lo // step) * step
    last = hi // step * step
    found: list[int] = []
    for size in wanted:
        value = min(max(size // step * step, first), last)
        if value not in found:
            found.append(value)
    return found


# Sizes that models run with and no edge or sweep size hits: hidden sizes (768 ... 14336) and
# head dims (80 ... 224). A kernel that is wrong only there (its own dispatch, or a cheat that
# a user's model would meet first) fails in the boundary walk. Since version 13 also 12288 (GPT-3
# 175B's and Mistral Large 2's hidden size: 12288 float32 values are exactly the 48 KiB of shared
# memory a launch takes without opting in, where a gate that forgets the kernel's static shared
# memory fails every launch, held-out attacks-v10's RMSNorm), 24576 (the same in 16 bits), and
# the FFN widths 28672 (Llama 70B) and 49152 (4 x 12288).
_MODEL_SIZES = (80, 96, 112, 160, 192, 224, 384, 576, 768, 1280, 1536, 2560, 3072, 5120, 6144, 7168,
                11008, 12288, 13824, 14336, 24576, 28672, 49152)


def boundary_sizes(lo: int, hi: int, step: int = 1) -> list[int]:
    """The sizes always tried for one dim: the edges first, then odd sizes, then the sizes models
    use, then the extremes."""
    model = [m for m in _MODEL_SIZES if m % step == 0]
    wanted = [lo, *(e * step for e in _EDGES), *(o * step for o in _ODD), *model, hi - step, hi]
    return legal_sizes(lo, hi, step, wanted)


def case_elements(sig, dims: dict[str, int], direction: str = "forward") -> int:
    """Elements over every tensor of one call (backward: inputs, outputs, grads twice)."""
    total = 0
    for t in [p.type for p in sig.inputs] + [o.type for o in sig.outputs]:
        total += math.prod(t.shape(dims))
    return total * (2 if direction == "backward" else 1)


def fit_budget(sig, dims: dict[str, int], ranges: dict[str, tuple[int, int]], budget: int,
               keep: str | None = None, direction: str = "forward") -> dict[str, int]:
    """Shrink the largest dims (never `keep`, unless nothing else is left) until the case's
    elements (case_elements, in `direction`) fit `budget`."""
    dims = dict(dims)
    steps = sig.symbol_divisors()
    for _ in range(200):
        if case_elements(sig, dims, direction) <= budget:
            break
        order = sorted(dims, key=lambda s: (s == keep, -dims[s]))
        for symbol in order:
            lo, _ = ranges[symbol]
            step = steps.get(symbol, 1)
            smaller = legal_sizes(lo, dims[symbol], step, [dims[symbol] // 2])[0]
            if smaller < dims[symbol]:
                dims[symbol] = smaller
                break
        else:
            break  # every dim at its minimum: the smallest legal case, even if over budget
    return dims


# ------------------------------------------------------------------ always-run cases

def dtype_turn(k: int, count: int) -> int:
    """The dtype of the walk's k-th case: the k-th in turn, shifted by one every full turn.
    Edge sizes come in threes (2^n - 1, 2^n, 2^n + 1): a plain `k % 3` would give each of
    three dtypes the same member of every three, e.g. float32 only ever the odd 2^n - 1."""
    return (k + k // count) % count if count else 0


EVERY_CLASS = Domain()  # no reference screened: every class in every dtype on every input
# A fresh draw's class (the capture and repeated-call checks, every other timed set): another than
# the first call's, so a stale output cannot pass for the new one (a mean of squares is 1 on
# normal values, 1/3 on uniform ones, where two normal draws agree to within sampling noise)
FRESH_CLASSES = ("uniform", "normal")


def fresh_case(case: Case, seed: int, domain: Domain = EVERY_CLASS) -> Case:
    """`case` redrawn at `seed` from another class than its own, on the inputs the screen
    (`domain`) draws that class on: its overrides for that class, not the case's (those were for
    the case's class). The case's own classes when the screen draws no other in its dtype."""
    for cls in FRESH_CLASSES:
        if cls != case.distribution and cls in domain.of(case.dtype):
            return replace(case, seed=seed, distribution=cls, overrides=domain.overrides(cls, case.dtype))
    return replace(case, seed=seed)


def boundary_cases(spec, budget: int = DEFAULT_BUDGET_ELEMENTS, seed: int = 0, domain=EVERY_CLASS) -> list[Case]:
    """Each dim walks its boundary sizes while the others take small edge sizes; every dtype
    is covered, and some cases use offset input views and other value distributions (those
    `domain` draws in that dtype, on the inputs it draws them on: verify/domain.py)."""
    sig = spec.signature
    symbols = sig.symbols()
    steps = sig.symbol_divisors()
    per_dim = {s: boundary_sizes(*spec.dims[s], steps.get(s, 1)) for s in symbols}
    small = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [3, 33, 1, 129]) for s in symbols}
    cases: list[Case] = []
    seen: set = set()
    k = 0
    for walking in symbols:
        for i, size in enumerate(per_dim[walking]):
            dims = {s: size if s == walking else small[s][(i + j) % len(small[s])]
                    for j, s in enumerate(symbols)}
            dims = fit_budget(sig, dims, spec.dims, budget, keep=walking)
            dtype = spec.dtypes[dtype_turn(k, len(spec.dtypes))]
            key = (tuple(dims.items()), dtype)
            if key in seen:
                continue
            seen.add(key)
            drawn = domain.of(dtype)
            distribution = "normal" if k % 3 else drawn[(k // 3) % len(drawn)]
            cases.append(make_case(dims, dtype, distribution=distribution, seed=seed + k,
                                   overrides=domain.overrides(distribution, dtype),
                                   offset=ELEMENT_OFFSETS[k % len(ELEMENT_OFFSETS)],
                                   scalars=scalar_values(spec, seed + k) if k % 2 else ()))
            k += 1
    # Every dtype at the widest row and half of it, aligned, the other dims small: kernels
    # switch schedule by row width (one block, a cluster of blocks, a looped pass), and the walk
    # above meets each width in one dtype only.
    row_dim = row_symbol(sig)
    if row_dim is not None:
        lo, hi = spec.dims[row_dim]
        step = steps.get(row_dim, 1)
        for width in legal_sizes(lo, hi, step, [hi // 16 * 16, hi // 32 * 16]):
            dims = {s: width if s == row_dim else small[s][0] for s in symbols}
            dims = fit_budget(sig, dims, spec.dims, budget, keep=row_dim)
            for dtype in spec.dtypes:
                key = (tuple(dims.items()), dtype)
                if key not in seen:
                    seen.add(key)
                    cases.append(make_case(dims, dtype, seed=seed + k))
                    k += 1
        # every value class at the widest row: a wide row's schedule (its chunks merged in a tree,
        # a sniffed tile) is where masked rows and value grids go wrong, and the classes below
        # meet only the mid and aligned shapes (held-out attacks-v6, session 27)
        widest = fit_budget(sig, {s: (legal_sizes(lo, hi, step, [hi // 16 * 16])[0] if s == row_dim
                                      else small[s][0]) for s in symbols}, spec.dims, budget, keep=row_dim)
        for value_class in VALUE_CLASSES:
            for dtype in spec.dtypes:
                if value_class in domain.of(dtype):
                    cases.append(make_case(widest, dtype, distribution=value_class, seed=seed + k,
                                           overrides=domain.overrides(value_class, dtype)))
                k += 1
    # Every dtype at one mid-sized aligned shape, so none is only seen at odd sizes; then every
    # value class and each scalar range's ends at that shape.
    mid = fit_budget(sig, {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [257])[0] for s in symbols},
                     spec.dims, budget)
    for dtype in spec.dtypes:
        cases.append(make_case(mid, dtype, seed=seed + k))
        k += 1
    for i, value_class in enumerate(VALUE_CLASSES):
        for dtype in spec.dtypes:
            if value_class in domain.of(dtype):
                cases.append(make_case(mid, dtype, distribution=value_class, seed=seed + k, offset=i % 2,
                                       overrides=domain.overrides(value_class, dtype)))
            k += 1
    # Every dtype at an aligned shape (every dim a multiple of 16) read through every offset:
    # a kernel that vectorizes on the size alone, not the pointer, meets a misaligned pointer in
    # its vector path (the walk above pairs offsets with odd sizes as often as with even ones).
    aligned = fit_budget(sig, {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [256, 64, 16])[0]
                               for s in symbols}, spec.dims, budget)
    for dtype in spec.dtypes:
        for offset in ELEMENT_OFFSETS[1:]:
            cases.append(make_case(aligned, dtype, seed=seed + k, offset=offset))
            k += 1
    # Normal inputs with special (NaN/inf) and loss-scaled output gradients (a backward's; a
    # forward ignores them): whole tiles of finite activations meet non-finite gradients, which a
    # fast path that skips "zero" gradients with a `> 0` test drops (held-out attacks-v6)
    for gradients in gradient_classes(spec):
        for dtype in spec.dtypes:
            cases.append(make_case(aligned, dtype, seed=seed + k, gradients=gradients))
            k += 1
    # Every value class again at the aligned shape, read from aligned pointers: the fast path
    # of a kernel (16-byte loads, whole tiles) is where a value sniff hides, and the odd mid
    # shape above sends it down the scalar path.
    for value_class in VALUE_CLASSES:
        for dtype in spec.dtypes:
            if value_class in domain.of(dtype):
                cases.append(make_case(aligned, dtype, distribution=value_class, seed=seed + k,
                                       overrides=domain.overrides(value_class, dtype)))
            k += 1
    # "identity" once per combination of ones and zeros over its constants (inputs.identity_constant:
    # the seed's low bits): a weight of ones beside a bias of zeros, a cos row of ones beside a sin
    # row of zeros (held-out attacks-v8: a LayerNorm backward and a rotary forward that skip the
    # identity, session 31); the value classes above draw one combination each
    count = len(identity_inputs(sig))
    for pattern in range(min(2 ** count, IDENTITY_PATTERNS_MAX) if count else 0):
        dtype = spec.dtypes[pattern % len(spec.dtypes)]
        if "identity" in domain.of(dtype):
            cases.append(make_case(mid, dtype, distribution="identity", seed=((seed + k) << 4) + pattern,
                                   overrides=domain.overrides("identity", dtype)))
        k += 1
    for end in (0, 1):
        values = scalar_ends(spec, end)
        if values:
            dtype = spec.dtypes[end % len(spec.dtypes)]
            # tiny values at the low end, where the screen draws them (a refused class would skip the case)
            distribution = "tiny" if end == 0 and "tiny" in domain.of(dtype) else "normal"
            cases.append(make_case(mid, dtype, seed=seed + k, scalars=values, distribution=distribution,
                                   overrides=domain.overrides(distribution, dtype)))
            k += 1
    cases += sweep_cases(spec, budget, seed + 10_000)
    return cases


VALUE_CLASSES = ("specials", "huge", "denormal", "outliers", "rounded", "quantized", "sparse", "masked", "int8",
                 "repeated", "mask-min", "identity", "offset", "zero-rows")
# output gradients drawn apart from the inputs' class (data.output_gradient): NaN/inf, loss-scaled,
# exactly one (a plain loss.backward()), whole rows of zeros (padded or loss-masked positions), one
# non-zero element per row (a gathered token's log-probability)
GRADIENT_CLASSES = ("specials", "large", "ones", "zero-rows", "one-hot", "zeros")
# one output's gradient zero and another's not (data.output_gradient): only where there are two
OUTPUT_CHOICE_CLASSES = ("first-only", "first-zero")
IDENTITY_PATTERNS_MAX = 8  # "identity" cases at the mid shape: every combination of up to 3 constants
SWEEP_RATIO = 1.18  # consecutive sizes of a dim's sweep differ by at most 18%: no band of 20% is missed
SWEEP_FROM = 48  # below this, the edge sizes already cover every size class


def gradient_classes(spec) -> tuple[str, ...]:
    """The output-gradient classes a spec's backward cases draw: OUTPUT_CHOICE_CLASSES too where the
    spec has two or more floating outputs (with one, they repeat "normal" and "zeros")."""
    floating = [o for o in spec.signature.outputs if o.type.is_floating]
    return GRADIENT_CLASSES + (OUTPUT_CHOICE_CLASSES if len(floating) >= 2 else ())


def sweep_sizes(lo: int, hi: int, step: int = 1) -> list[int]:
    """A geometric walk from SWEEP_FROM to the top of the range, each size at most 15% above
    the last: a kernel that is wrong for a band of sizes (its own dispatcher's classes, or on
    purpose) meets one of them."""
    sizes, size = [], max(lo, SWEEP_FROM)
    while size < hi:
        sizes.append(size)
        size = max(size + step, int(size * SWEEP_RATIO))
    sizes.append(hi)
    return legal_sizes(lo, hi, step, sizes)


def sweep_cases(spec, budget: int, seed: int) -> list[Case]:
    """Each dim walks its sweep while the others stay small (3 of a leading dim, the smallest
    legal size otherwise), dtypes in turn."""
    sig = spec.signature
    symbols = sig.symbols()
    steps = sig.symbol_divisors()
    small = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [3])[0] for s in symbols}
    cases, seen = [], set()
    for walking in symbols:
        for i, size in enumerate(sweep_sizes(*spec.dims[walking], steps.get(walking, 1))):
            dims = fit_budget(sig, {s: size if s == walking else small[s] for s in symbols}, spec.dims, budget,
                              keep=walking)
            key = tuple(dims.items())
            if key in seen:
                continue
            seen.add(key)
            cases.append(make_case(dims, spec.dtypes[i % len(spec.dtypes)], seed=seed + len(cases)))
    return cases


def scalar_values(spec, seed: int) -> tuple:
    """Every scalar drawn from its range (docs/VERIFIER.md "Inputs")."""
    import random

    from ..inputs import draw_scalar

    rng = random.Random(seed)
    return tuple((p.name, draw_scalar(p, rng)) for p in spec.signature.scalars)


def scalar_ends(spec, end: int) -> tuple:
    """Every ranged scalar at the low (0) or high (1) end of its range; () when none has a range."""
    from ..inputs import default_scalar, scalar_range

    values, ranged = [], False
    for p in spec.signature.scalars:
        bounds = scalar_range(p)
        if p.type.kind == "bool":
            values.append((p.name, bool(end)))
            ranged = True
        elif bounds is not None:
            values.append((p.name, type(default_scalar(p))(bounds[end])))
            ranged = True
        else:
            values.append((p.name, default_scalar(p)))
    return tuple(values) if ranged else ()


# Full-size cases: benchmark shapes and the tops of the dims ranges, at real sizes.
FULL_SIZE_BYTES = 10 << 30  # all tensors of one call, in the working dtype (tensors past 2 GiB: 32-bit offsets)


def call_bytes(sig, dims: dict[str, int], dtype: str, direction: str = "forward") -> int:
    from ..inputs import TORCH_DTYPES

    import torch

    total = 0
    for t in [p.type for p in sig.inputs] + [o.type for o in sig.outputs]:
        itemsize = torch.empty((), dtype=TORCH_DTYPES[t.dtype_for(dtype)]).element_size()
        total += math.prod(t.shape(dims)) * itemsize
    return total * (2 if direction == "backward" else 1)  # as case_elements counts a backward


def full_size_cases(spec, seed: int = 0, limit_bytes: int = FULL_SIZE_BYTES) -> list[Case]:
    """Each benchmark shape as it is (dtypes in turn), then for each dim a case with that dim at
    the top of its range (every dim at its top when that fits in `limit_bytes`, else the others
    shrunk until it does)."""
    sig = spec.signature
    symbols = sig.symbols()
    cases, seen = [], set()

    def add(dims: dict[str, int], dtype: str) -> None:
        key = (tuple(dims.items()), dtype)
        if key not in seen:
            seen.add(key)
            cases.append(make_case(dims, dtype, seed=seed + len(cases)))

    for i, shape in enumerate(spec.benchmark):
        add({s: int(shape[s]) for s in symbols}, spec.dtypes[i % len(spec.dtypes)])
    top = {s: spec.dims[s][1] for s in symbols}
    widest = max(spec.dtypes, key=lambda d: call_bytes(sig, top, d))
    if call_bytes(sig, top, widest) <= limit_bytes:
        add(top, widest)
    else:
        add_walked_tops(spec, top, widest, limit_bytes, add)
    add_odd_twin(spec, cases, add)
    add_model_twin(spec, cases, add)
    add_model_widths(spec, add)
    add_narrow_widths(spec, add)
    return cases


MODEL_WIDTHS_AT_SCALE = 3  # model hidden sizes tried at a benchmark shape's scale
# narrow rows at a benchmark shape's scale: QK-norm's head dim, small models' hidden sizes
NARROW_WIDTHS = (128, 896, 2048)


def add_narrow_widths(spec, add) -> None:
    """Narrow rows (NARROW_WIDTHS below the first benchmark shape's width, within the range) at that
    shape's elements, the other dims grown to keep them (within their ranges), dtypes in turn: a
    schedule for narrow rows taken only in large calls (several rows per warp, held-out attacks-v8's
    rmsnorm: each row normalized by its pair's statistics from 2^22 elements, session 31) meets
    narrow rows only in small cases otherwise."""
    sig = spec.signature
    row = row_symbol(sig)
    if row is None or not spec.benchmark:
        return
    lo, hi = spec.dims[row]
    steps = sig.symbol_divisors()
    shape = {s: int(spec.benchmark[0][s]) for s in sig.symbols()}
    budget = case_elements(sig, shape)
    widths = legal_sizes(lo, hi, steps.get(row, 1), [w for w in NARROW_WIDTHS if w < shape[row]])
    for i, width in enumerate(w for w in widths if w < shape[row]):
        dims = grown_to(sig, {**shape, row: width}, spec.dims, budget, keep=row)
        add(dims, spec.dtypes[i % len(spec.dtypes)])


def grown_to(sig, dims: dict[str, int], ranges: dict[str, tuple[int, int]], budget: int, keep: str) -> dict[str, int]:
    """`dims` with the dims other than `keep` grown, largest first and each within its range, until
    the case's elements reach about `budget` (never past it)."""
    dims = dict(dims)
    steps = sig.symbol_divisors()
    for symbol in sorted((s for s in dims if s != keep), key=lambda s: -dims[s]):
        factor = budget / max(case_elements(sig, dims), 1)
        if factor <= 1:
            break
        lo, hi = ranges[symbol]
        dims[symbol] = legal_sizes(lo, hi, steps.get(symbol, 1), [int(dims[symbol] * factor)])[0]
    return fit_budget(sig, dims, ranges, budget, keep=keep)


def add_model_widths(spec, add) -> None:
    """A few model hidden sizes that are not powers of two (3072, 5120, 7168: odd multiples of
    1024 first) as the row width of the first benchmark shape, the other dims as they are, shrunk
    to its elements if the width is larger (dtypes in turn): a schedule chosen above some size that
    unrolls its chunks by two and drops the odd last one meets no odd chunk count at the
    benchmark's round widths, and the small cases with these widths stay under its threshold
    (held-out attacks-v6's add_rmsnorm, session 27)."""
    sig = spec.signature
    row = row_symbol(sig)
    if row is None or not spec.benchmark:
        return
    lo, hi = spec.dims[row]
    step = sig.symbol_divisors().get(row, 1)
    shape = {s: int(spec.benchmark[0][s]) for s in sig.symbols()}
    widths = [w for w in _MODEL_SIZES if w >= 1024 and w & (w - 1) and lo <= w <= hi and w % step == 0
              and w != shape[row]]
    widths.sort(key=lambda w: (not (w % 1024 == 0 and (w // 1024) % 2), w))
    budget = case_elements(sig, shape)
    for i, width in enumerate(widths[:MODEL_WIDTHS_AT_SCALE]):
        dims = fit_budget(sig, {**shape, row: width}, spec.dims, budget, keep=row)
        add(dims, spec.dtypes[i % len(spec.dtypes)])


def add_walked_tops(spec, top: dict[str, int], widest: str, limit_bytes: int, add) -> None:
    """For each dim, a case with that dim at its top and the others shrunk until the call fits."""
    sig = spec.signature
    symbols = sig.symbols()
    for walking in symbols:
        dims = dict(top)
        for _ in range(200):
            if call_bytes(sig, dims, widest) <= limit_bytes:
                break
            others = sorted((s for s in symbols if s != walking and dims[s] > spec.dims[s][0]), key=lambda s: -dims[s])
            if not others:
                break
            s = others[0]
            step = sig.symbol_divisors().get(s, 1)
            dims[s] = legal_sizes(spec.dims[s][0], dims[s], step, [dims[s] // 2])[0]
        if call_bytes(sig, dims, widest) <= limit_bytes * 4:  # a single dim's top may exceed the cap alone
            add(dims, widest)


def odd_neighbour(size: int, lo: int, hi: int, step: int) -> int:
    """A legal size one step below `size` (else above): 16384 -> 16383, so a product of such
    sizes is a multiple of no large power of two."""
    for candidate in (size - step, size + step):
        if lo <= candidate <= hi:
            return candidate
    return size


def add_odd_twin(spec, cases: list[Case], add) -> None:
    """The largest full-size case again with every dim one step off, in every dtype no wider than
    the largest case's: benchmark shapes and range tops are round numbers, so a path taken only
    above some size that drops the tail after its last whole chunk (held-out attacks-v2, session
    21) meets no tail there. Every dtype since version 13: a bfloat16-only path for large calls
    that drops the last N % 4 rows met its only odd twin in float16 (held-out attacks-v10)."""
    if not cases:
        return
    sig = spec.signature
    steps = sig.symbol_divisors()
    largest = max(cases, key=lambda c: call_bytes(sig, c.dim_map, c.dtype))
    odd = {s: odd_neighbour(v, *spec.dims[s], steps.get(s, 1)) for s, v in largest.dim_map.items()}
    # a wider dtype than the largest case's would take more bytes (it may not fit the GPU, and a
    # twin shrunk to fit is round again): the largest case's own dtype stands in for it
    first = spec.dtypes.index(largest.dtype) + 1
    for dtype in spec.dtypes[first:] + spec.dtypes[:first]:  # the next dtype first, as before
        wider = call_bytes(sig, odd, dtype) > call_bytes(sig, odd, largest.dtype)
        add(odd, largest.dtype if wider else dtype)


def model_size(size: int, lo: int, hi: int, step: int) -> int:
    """A size as models have them, near 98% of `size` (at least 90%): an odd multiple of 256
    (Llama 3's vocabulary is 128256 = 501 x 256), of 16 below 8192 (sizes below 64 stay): even,
    aligned for 16-byte access, a multiple of no power of two above the unit."""
    unit = 256 if size >= 8192 else 16 if size >= 64 else 0
    if not unit or unit % step:
        return size
    k = int(size * 0.98) // unit
    k -= 1 - k % 2  # odd
    candidate = k * unit
    return candidate if k > 0 and candidate >= 0.9 * size and lo <= candidate <= hi else size


def add_model_twin(spec, cases: list[Case], add) -> None:
    """The largest full-size case again at model sizes (model_size): round benchmark shapes and
    their odd twins leave out the even, aligned sizes real models use, where a kernel that splits
    rows into chunks of a large power of two and miscounts the last one (held-out attacks-v5's
    cross-entropy at a 128256 vocabulary, session 26) goes wrong."""
    if not cases:
        return
    sig = spec.signature
    steps = sig.symbol_divisors()
    row = row_symbol(sig)
    largest = max(cases, key=lambda c: call_bytes(sig, c.dim_map, c.dtype))
    widest = max(cases, key=lambda c: (c.dim_map.get(row, 0), call_bytes(sig, c.dim_map, c.dtype)))
    for case in (largest, widest):  # the most bytes, and the longest rows (a vocabulary's)
        dims = {s: model_size(v, *spec.dims[s], steps.get(s, 1)) for s, v in case.dim_map.items()}
        if dims != case.dim_map:
            add(dims, case.dtype)


INT32_ELEMENTS = 1 << 31  # an int32 element offset wraps at this many elements


def past_int32_case(spec, seed: int = 0, limit: int | None = None) -> Case | None:
    """A case whose largest tensor holds just over `limit` elements, where the spec's ranges allow
    one (else None): an int32 offset (row * C + col in `int`) wraps there and reads or writes
    another row, which no full-size case reaches (they stop at FULL_SIZE_BYTES and shrink to fit
    their float64 truth; held-out attacks-v6's cross_entropy_int32_offsets passed version 6). The
    row's width and the dims of the largest tensor stay as large as they can, other dims shrink
    to small sizes; the narrowest dtype (the fewest bytes past the mark)."""
    from ..inputs import TORCH_DTYPES

    import torch

    limit = INT32_ELEMENTS if limit is None else limit
    sig = spec.signature
    steps = sig.symbol_divisors()
    symbols = sig.symbols()
    dims = {s: spec.dims[s][1] for s in symbols}
    tensors = [p.type for p in sig.inputs] + [o.type for o in sig.outputs]
    biggest = max(tensors, key=lambda t: math.prod(t.shape(dims)))

    def elements(d: dict[str, int]) -> int:
        return math.prod(biggest.shape(d))

    if elements(dims) <= limit:
        return None
    in_biggest = {d.symbol for d in biggest.dims if d.symbol}
    for s in symbols:  # a dim the largest tensor does not have costs memory and reaches nothing
        if s not in in_biggest:
            dims[s] = legal_sizes(*spec.dims[s], steps.get(s, 1), [min(dims[s], 64)])[0]
    row = row_symbol(sig)
    # halve the largest dims (the row's last) while the tensor stays past the mark
    for _ in range(200):
        changed = False
        for s in sorted(in_biggest, key=lambda s: (s == row, -dims[s])):
            half = legal_sizes(spec.dims[s][0], dims[s], steps.get(s, 1), [dims[s] // 2])[0]
            if half < dims[s] and elements({**dims, s: half}) > limit:
                dims[s] = half
                changed = True
                break
        if not changed:
            break
    # then the largest non-row dim down to the smallest legal size that stays past the mark
    outer = [s for s in in_biggest if s != row] or [row]
    s = max(outer, key=lambda s: dims[s])
    step = steps.get(s, 1)
    lo, hi = -(-spec.dims[s][0] // step), dims[s] // step  # in units of step
    while lo < hi:
        mid = (lo + hi) // 2
        if elements({**dims, s: mid * step}) > limit:
            hi = mid
        else:
            lo = mid + 1
    dims[s] = hi * step
    narrowest = min(spec.dtypes, key=lambda d: torch.empty((), dtype=TORCH_DTYPES[d]).element_size())
    return make_case(dims, narrowest, seed=seed)


def fewer_rows_case(spec, case: Case) -> Case | None:
    """`case` with every dim but the row's (the first input's last) cut to about a third, within
    its range: the next call of a shrinking batch or a chunked loss's last chunk. None when no dim
    can shrink."""
    return _rows_scaled(spec, case, lambda size: max(size // 3, 1))


def more_rows_case(spec, case: Case) -> Case | None:
    """`case` with every dim but the row's doubled, within its range: the next, larger batch (or
    length bucket) after a call on fewer rows. None when no dim can grow."""
    return _rows_scaled(spec, case, lambda size: size * 2)


def _rows_scaled(spec, case: Case, scaled) -> Case | None:
    sig = spec.signature
    keep, steps = row_symbol(sig), sig.symbol_divisors()
    dims = dict(case.dim_map)
    for symbol, size in dims.items():
        if symbol != keep:
            lo, hi = spec.dims[symbol]
            dims[symbol] = legal_sizes(lo, hi, steps.get(symbol, 1), [scaled(size)])[0]
    if dims == case.dim_map:
        return None
    return replace(case, dims=tuple(dims.items()), seed=case.seed + 1)


# Classes drawn again at the first benchmark shape (full size): a kernel whose schedule above some
# size (a persistent grid, rows seeded from the block's previous row) mishandles NaN, infinities,
# huge or masked rows meets those values only at small sizes otherwise (held-out attacks-v7,
# session 30: a warm start wrong only past 2^22 elements and 1024 rows).
# "offset" and "zero-rows" since version 12 (held-out attacks-v9, session 34: a one-pass variance and
# an overflow-safe RMSNorm with no guard for an all-zero row, both in wide-row schedules).
CLASSES_AT_SCALE = ("specials", "huge", "masked", "repeated", "mask-min", "offset", "zero-rows")
# ... and one class at each other benchmark shape, in turn: a schedule taken only at wide rows and
# many of them (held-out attacks-v8's softmax: a one-pass schedule from 1024 rows of 65536, NaN on
# rows with a masked run inside, session 31) meets masked rows nowhere else
CLASSES_AT_OTHER_SHAPES = ("masked", "mask-min", "specials", "repeated", "huge")


def classes_at_scale(spec, shapes: list[Case], domain: Domain, seed: int, backward: bool = False) -> list[Case]:
    """The first of `shapes` (the benchmark shapes' full-size cases) again in each class of
    CLASSES_AT_SCALE the screen draws in its dtype, the spec's dtypes in turn; each other shape
    again in one class of CLASSES_AT_OTHER_SHAPES, in turn (in the first dtype that draws it); for
    a backward, the first shape again in each of OUTPUT_CHOICE_CLASSES where the spec draws them."""
    shapes = [shapes] if isinstance(shapes, Case) else shapes  # (the first shape alone, as version 8 took it)
    if not shapes:
        return []
    cases = []
    for number, cls in enumerate(c for c in CLASSES_AT_SCALE if c in VALUE_CLASSES):
        dtype = spec.dtypes[number % len(spec.dtypes)]
        if cls in domain.of(dtype):
            cases.append(replace(shapes[0], dtype=dtype, distribution=cls, seed=seed + number,
                                 overrides=domain.overrides(cls, dtype)))
    for number, shape in enumerate(shapes[1:]):
        cls = CLASSES_AT_OTHER_SHAPES[number % len(CLASSES_AT_OTHER_SHAPES)]
        dtype = next((d for d in spec.dtypes if cls in domain.of(d)), None)
        if dtype is not None:
            cases.append(replace(shape, dtype=dtype, distribution=cls, seed=seed + 100 + number,
                                 overrides=domain.overrides(cls, dtype)))
    # one output's gradient zero at full size too (a schedule for large calls keeps its own fast paths)
    choices = [g for g in gradient_classes(spec) if g in OUTPUT_CHOICE_CLASSES] if backward else []
    for number, gradients in enumerate(choices):
        cases.append(replace(shapes[0], dtype=spec.dtypes[number % len(spec.dtypes)], distribution="normal",
                             seed=seed + 200 + number, overrides=(), gradients=gradients))
    return cases


def scalars_at_scale(spec, shape: Case, domain: Domain, seed: int) -> list[Case]:
    """`shape` (the first benchmark shape, full size) with its scalars drawn and at each end of
    their ranges, tiny values where the screen draws them (an epsilon matters against a small sum
    of squares); none for a spec without scalars. Every other full-size case and timed call uses
    the defaults, so a schedule for large calls that keeps a default as a constant (held-out
    attacks-v9's add_rmsnorm: eps = 1e-6 from 2^22 elements, where Llama's configs pass 1e-5,
    session 34) met drawn scalars only in small cases before version 12."""
    if not spec.signature.scalars:
        return []
    cases = []
    for number, values in enumerate((scalar_values(spec, seed), scalar_ends(spec, 0), scalar_ends(spec, 1))):
        if not values:
            continue
        dtype = spec.dtypes[number % len(spec.dtypes)]
        # tiny values only where the screen passed every class (else each case is screened on the
        # CPU first: too slow at full size)
        cls = "tiny" if "tiny" in domain.of(dtype) and not domain.rejected else "normal"
        cases.append(replace(shape, dtype=dtype, distribution=cls, seed=seed + number, scalars=values,
                             overrides=domain.overrides(cls, dtype)))
    return cases


def smoke_case(spec, seed: int = 0) -> Case:
    """A small first case: a few rows of an odd width, aligned, normal values."""
    sig = spec.signature
    steps = sig.symbol_divisors()
    dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [37])[0] for s in sig.symbols()}
    return make_case(dims, spec.dtypes[0], seed=seed)


def one_row_case(spec, base: Case | None, seed: int = 0) -> Case | None:
    """`base` with every dim but the row's at its smallest legal size (one row of a decode step's
    width, batch 1), or None where that is `base` itself or there is no base."""
    if base is None:
        return None
    sig = spec.signature
    steps = sig.symbol_divisors()
    row = row_symbol(sig)
    dims = {s: v if s == row else legal_sizes(*spec.dims[s], steps.get(s, 1), [1])[0] for s, v in base.dim_map.items()}
    return None if dims == base.dim_map else make_case(dims, base.dtype, seed=seed)


def row_symbol(sig) -> str | None:
    """The symbol of the first input's last dim (the row kernels work along it), if any."""
    return next((d.symbol for d in reversed(sig.inputs[0].type.dims) if d.symbol), None) if sig.inputs else None


def large_case(spec, budget: int = DEFAULT_BUDGET_ELEMENTS, seed: int = 0, dtype: str | None = None) -> Case:
    """The first benchmark shape (else the largest sizes) scaled into the budget: many blocks,
    so races between blocks and atomics have room to show."""
    sig = spec.signature
    if spec.benchmark:
        dims = dict(spec.benchmark[0])
    else:
        dims = {s: spec.dims[s][1] for s in sig.symbols()}
    # keep rows wide (the last dim of the first input): many blocks per row, where atomics race
    row_dim = row_symbol(sig)
    dims = fit_budget(sig, dims, spec.dims, budget * LARGE_CASE_FACTOR, keep=row_dim)
    return make_case(dims, dtype or spec.dtypes[0], seed=seed)


# ------------------------------------------------------------------ Hypothesis

@st.composite
def _size(draw, lo: int, hi: int, step: int) -> int:
    # log-uniform: as many small sizes as large ones; shrinks towards `lo`
    top = max(1, math.ceil(math.log2(max(hi, 1) + 1)))
    bits = draw(st.integers(0, top))
    lower = min(max(lo, (1 << bits) // 2), hi)
    upper = max(min(hi, 1 << bits), lower)
    value = draw(st.integers(lower, upper))
    return legal_sizes(lo, hi, step, [value])[0]


@st.composite
def case_strategy(draw, spec, budget: int = DEFAULT_BUDGET_ELEMENTS, domain=EVERY_CLASS) -> Case:
    sig = spec.signature
    steps = sig.symbol_divisors()
    dims = {s: draw(_size(*spec.dims[s], steps.get(s, 1)), label=s) for s in sig.symbols()}
    dims = fit_budget(sig, dims, spec.dims, budget)
    dtype = draw(st.sampled_from(list(spec.dtypes)))
    distribution = draw(st.sampled_from(domain.of(dtype)))
    offset = draw(st.sampled_from(ELEMENT_OFFSETS))
    seed = draw(st.integers(0, 2**31 - 1))
    scalars = scalar_values(spec, seed) if draw(st.booleans()) else ()
    gradients = draw(st.sampled_from(("",) + gradient_classes(spec)))  # "" (the inputs' class) first: shrinks to it
    return make_case(dims, dtype, distribution=distribution, seed=seed, offset=offset, scalars=scalars,
                     overrides=domain.overrides(distribution, dtype), gradients=gradients)


__all__ = ["Case", "GRADIENT_CLASSES", "OUTPUT_CHOICE_CLASSES", "gradient_classes", "DEFAULT_BUDGET_ELEMENTS", "ELEMENT_OFFSETS", "input_offset", "boundary_cases", "boundary_sizes", "case_strategy",
           "case_elements", "fit_budget", "fresh_case", "full_size_cases", "scalars_at_scale", "INT32_ELEMENTS", "large_case", "legal_sizes", "make_case", "one_row_case", "past_int32_case",
           "scalar_values", "smoke_case", "sweep_cases", "sweep_sizes"]
