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
from dataclasses import asdict, dataclass

from hypothesis import strategies as st

from ..inputs import DISTRIBUTIONS

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
ELEMENT_OFFSETS = (0, 1, 3)  # input views start this many elements into their storage


@dataclass(frozen=True)
class Case:
    dims: tuple[tuple[str, int], ...]  # ordered (symbol, size) pairs: hashable
    dtype: str
    distribution: str = "normal"
    seed: int = 0
    offset: int = 0  # elements; 1 and 3 make every input view unaligned for 16-byte vectors

    @property
    def dim_map(self) -> dict[str, int]:
        return dict(self.dims)

    def describe(self) -> str:
        shape = " ".join(f"{k}={v}" for k, v in self.dims)
        view = f", inputs offset by {self.offset} element(s)" if self.offset else ""
        return f"{shape} {self.dtype}, {self.distribution} values, seed {self.seed}{view}"

    def to_json(self) -> dict:
        data = asdict(self)
        data["dims"] = dict(self.dims)
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


def boundary_sizes(lo: int, hi: int, step: int = 1) -> list[int]:
    """The sizes always tried for one dim: the edges first, then odd sizes, then the extremes."""
    wanted = [lo, *(e * step for e in _EDGES), *(o * step for o in _ODD), hi - step, hi]
    return legal_sizes(lo, hi, step, wanted)


def case_elements(sig, dims: dict[str, int], direction: str = "forward") -> int:
    """Elements over every tensor of one call (backward: inputs, outputs, grads twice)."""
    total = 0
    for t in [p.type for p in sig.inputs] + [o.type for o in sig.outputs]:
        total += math.prod(t.shape(dims))
    return total * (2 if direction == "backward" else 1)


def fit_budget(sig, dims: dict[str, int], ranges: dict[str, tuple[int, int]], budget: int,
               keep: str | None = None) -> dict[str, int]:
    """Shrink the largest dims (never `keep`, unless nothing else is left) until the case fits."""
    dims = dict(dims)
    steps = sig.symbol_divisors()
    for _ in range(200):
        if case_elements(sig, dims) <= budget:
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

def boundary_cases(spec, budget: int = DEFAULT_BUDGET_ELEMENTS, seed: int = 0) -> list[Case]:
    """Each dim walks its boundary sizes while the others take small edge sizes; every dtype
    is covered, and some cases use offset input views and other value distributions."""
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
            dtype = spec.dtypes[k % len(spec.dtypes)]
            key = (tuple(dims.items()), dtype)
            if key in seen:
                continue
            seen.add(key)
            distribution = "normal" if k % 3 else DISTRIBUTIONS[(k // 3) % len(DISTRIBUTIONS)]
            cases.append(make_case(dims, dtype, distribution=distribution, seed=seed + k,
                                   offset=ELEMENT_OFFSETS[k % len(ELEMENT_OFFSETS)]))
            k += 1
    # Every dtype at the widest row and half of it, aligned, the other dims small: kernels
    # switch schedule by row width (one block, a cluster of blocks, a looped pass), and the walk
    # above meets each width in one dtype only.
    row_dim = _row_dim(sig)
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
    # Every dtype at one mid-sized aligned shape, so none is only seen at odd sizes.
    mid = fit_budget(sig, {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [257])[0] for s in symbols},
                     spec.dims, budget)
    for dtype in spec.dtypes:
        cases.append(make_case(mid, dtype, seed=seed + k))
        k += 1
    return cases


def smoke_case(spec, seed: int = 0) -> Case:
    """A small first case: a few rows of an odd width, aligned, normal values."""
    sig = spec.signature
    steps = sig.symbol_divisors()
    dims = {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [37])[0] for s in sig.symbols()}
    return make_case(dims, spec.dtypes[0], seed=seed)


def _row_dim(sig) -> str | None:
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
    row_dim = _row_dim(sig)
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
def case_strategy(draw, spec, budget: int = DEFAULT_BUDGET_ELEMENTS) -> Case:
    sig = spec.signature
    steps = sig.symbol_divisors()
    dims = {s: draw(_size(*spec.dims[s], steps.get(s, 1)), label=s) for s in sig.symbols()}
    dims = fit_budget(sig, dims, spec.dims, budget)
    dtype = draw(st.sampled_from(list(spec.dtypes)))
    distribution = draw(st.sampled_from(DISTRIBUTIONS))
    offset = draw(st.sampled_from(ELEMENT_OFFSETS))
    seed = draw(st.integers(0, 2**31 - 1))
    return make_case(dims, dtype, distribution=distribution, seed=seed, offset=offset)


__all__ = ["Case", "DEFAULT_BUDGET_ELEMENTS", "boundary_cases", "boundary_sizes", "case_strategy",
           "case_elements", "fit_budget", "large_case", "legal_sizes", "make_case", "smoke_case"]
