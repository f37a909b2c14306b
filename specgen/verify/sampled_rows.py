"""The case past 2^32 elements with its truth on sampled rows (verifier version 14).

Offsets kept in unsigned 32-bit arithmetic wrap past 2^32 elements, and a kernel with them reads and
writes the wrong rows there (held-out attacks-v10's log-softmax: 65536 x 128256 log-probabilities,
RL fine-tuning's). Version 13 made the case but planned it out on the H200: its float32 truth did not
fit beside a tensor of 4.3e9 elements. Here the kernel runs on the whole case, every element is
checked written (two runs, two fills) and the same twice, and the truth is computed for a few rows
only: the first, those around each element offset where 32-bit offsets wrap (2^31 and 2^32 elements
of the largest tensor), and the last. The rows are slices along the outermost dim of the largest
tensor; every tensor whose first dim is that symbol is sliced alike, the others (a [D] weight) are
passed whole, and outputs without it (a weight's gradient, a mean loss) are not compared.

That is sound only where an output row depends on its own input rows alone; a probe on a small case
says so, comparing the float64 truth of sampled rows with the same rows of the whole truth
(`separable`). Where it does not hold (a loss averaged over rows scales every row's gradient by the
row count) the case stays `not run`, as before.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from .data import CaseData, _forward_truth, prepare
from .strategies import legal_sizes, make_case, smoke_case

SAMPLED_ROWS_ELEMENTS = 1 << 25  # the sampled rows' elements of the largest tensor, at most
WRAP_MARKS = (1 << 31, 1 << 32)  # element offsets where 32-bit signed and unsigned offsets wrap
PROBE_ROWS = 8  # the probe's size along the sliced symbol (at least)


def tensor_types(spec, direction: str) -> dict:
    """Every tensor a call reads or writes, by ABI name, with its declared type."""
    sig = spec.signature
    types = {p.name: p.type for p in sig.inputs}
    saved = {v.field: v.type for v in spec.saved_values}
    if direction == "forward":
        return {**types, **{o.name: o.type for o in sig.outputs}, **saved}
    return {**types, **{o.name: o.type for o in sig.outputs}, **saved,
            **{f"grad_{o.name}": o.type for o in sig.outputs},
            **{f"grad_{p.name}": p.type for p in sig.inputs}}


def first_symbol(tensor_type) -> str | None:
    """The symbol of the first dim where that dim is the plain symbol (not 2*N, N+1)."""
    return tensor_type.dims[0].symbol if tensor_type.dims and tensor_type.dims[0].is_plain_symbol else None


def sliced_symbol(spec, direction: str, dims: dict) -> str | None:
    """The symbol of the outermost dim of the largest tensor of the call, or None (a literal dim)."""
    types = tensor_types(spec, direction)
    largest = max(types.values(), key=lambda t: math.prod(t.shape(dims)))
    symbol = first_symbol(largest)
    if symbol is None:
        return None
    if any(symbol in {d.symbol for d in t.dims[1:]} or (t.dims and t.dims[0].symbol == symbol and
                                                         not t.dims[0].is_plain_symbol) for t in types.values()):
        return None  # the symbol elsewhere (another dim, an expression): a slice along it is not of rows there
    return symbol


def elements_per_row(spec, direction: str, dims: dict) -> int:
    """Elements of the largest tensor per index of its outermost dim (the sliced symbol's)."""
    largest = max(tensor_types(spec, direction).values(), key=lambda t: math.prod(t.shape(dims)))
    return max(math.prod(largest.shape(dims)[1:]), 1)


def row_ranges(rows: int, elements_per_row: int, budget: int = SAMPLED_ROWS_ELEMENTS) -> list[tuple[int, int]]:
    """Sorted, disjoint [start, stop) ranges of rows: the first two, the rows around each wrap mark's
    row (the one holding element offset 2^31, 2^32 of the largest tensor, one before and one after),
    the last two; fewer around each where that is more than `budget` elements."""
    per = max(elements_per_row, 1)
    reach = 1 if 6 * per * (2 + len(WRAP_MARKS)) > budget else 2
    wanted = [(0, reach), (rows - reach, rows)]
    for mark in WRAP_MARKS:
        at = mark // per
        if at < rows:
            wanted.append((at - reach + 1, at + reach))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted((max(a, 0), min(b, rows)) for a, b in wanted):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        elif start < stop:
            merged.append((start, stop))
    return merged


def take(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([tensor[a:b] for a, b in ranges]) if len(ranges) > 1 else tensor[ranges[0][0]:ranges[0][1]]


def sliced_values(values: dict, types: dict, symbol: str, ranges) -> dict:
    """The tensors whose first dim is `symbol` cut to `ranges`; the others, and scalars, as they are."""
    return {name: take(v, ranges) if isinstance(v, torch.Tensor) and name in types
            and first_symbol(types[name]) == symbol else v for name, v in values.items()}


def rows_derive(spec, data: CaseData, symbol: str, count: int):
    """derive(sliced inputs) -> (truth, reference) of the sampled rows: the forward traced again at
    the sliced dims (the reference is held to its signature's shapes); the backward's derive reads
    its inputs' shapes."""
    if data.direction != "forward":
        return data.derive
    dims = {**data.dims, symbol: count}
    return _forward_truth(spec, list(data.inputs), data.scalars, dims, data.case.dtype,
                          [o.name for o in spec.signature.outputs], lean=data.lean)


def rows_data(spec, data: CaseData, symbol: str, ranges) -> CaseData | None:
    """The case cut to the sampled rows: the outputs that have them, their truth (and, lean or not,
    what the tolerance needs) from the sliced inputs; None when no output has the sliced symbol first."""
    types = tensor_types(spec, data.direction)
    count = sum(b - a for a, b in ranges)
    outputs = [dataclasses.replace(slot, shape=(count, *slot.shape[1:])) for slot in data.outputs
               if first_symbol(types[slot.name]) == symbol]
    if not outputs:
        return None
    inputs = sliced_values(data.inputs, types, symbol, ranges)
    derive = rows_derive(spec, data, symbol, count)
    truth, reference = derive(inputs)
    kept = {slot.name for slot in outputs}
    return dataclasses.replace(
        data, inputs=inputs, storages={}, snapshots={}, outputs=outputs, dims={**data.dims, symbol: count},
        truth={k: v for k, v in truth.items() if k in kept}, reference={k: v for k, v in reference.items() if k in kept},
        atol={k: v for k, v in data.atol.items() if k in kept}, derive=derive, later=False, tolerance={},
        alternative={}, input_refs={}, output_refs={})


def probe_case(spec, symbol: str, seed: int):
    """A small case with at least PROBE_ROWS along `symbol` (the smoke case's sizes elsewhere)."""
    steps = spec.signature.symbol_divisors()
    smoke = smoke_case(spec, seed=seed)
    dims = dict(smoke.dim_map)
    dims[symbol] = legal_sizes(*spec.dims[symbol], steps.get(symbol, 1), [max(dims[symbol], PROBE_ROWS)])[0]
    return make_case(dims, "float32", seed=seed) if "float32" in spec.dtypes else make_case(dims, spec.dtypes[0], seed=seed)


def separable(spec, direction: str, symbol: str, device, seed: int = 0) -> bool:
    """Whether the outputs with `symbol` first are computed row by row: on a probe case, the float64
    truth of three sampled rows (first, middle, last) equals those rows of the whole case's truth."""
    case = probe_case(spec, symbol, seed)
    rows = case.dim_map[symbol]
    if rows < 3:
        return False
    data = prepare(spec, case, direction, device)
    ranges = [(0, 1), (rows // 2, rows // 2 + 1), (rows - 1, rows)]
    cut = rows_data(spec, data, symbol, ranges)
    if cut is None:
        return False
    for slot in cut.outputs:
        whole, part = take(data.truth[slot.name], ranges), cut.truth[slot.name]
        if whole.shape != part.shape:
            return False
        if whole.is_floating_point():
            scale = float(whole.abs().nan_to_num(0, 0, 0).max()) if whole.numel() else 0.0
            if not torch.allclose(part.double(), whole.double(), rtol=1e-9, atol=1e-12 * max(scale, 1.0),
                                  equal_nan=True):
                return False
        elif not torch.equal(part, whole):
            return False
    return True


def check_sampled_rows(runner, spec, data: CaseData, symbol: str, *, deterministic: bool, stream: str = "pool") -> None:
    """check_case's two runs on the whole staged case (`data` prepared with later=True: no truth),
    every element written and the same bits twice, then the sampled rows within tolerance."""
    from .checks import called_on, check_close, checked_twice

    with called_on(stream):
        out_a = checked_twice(runner, data, deterministic=deterministic, stream=stream)
        ranges = row_ranges(data.dims[symbol], elements_per_row(spec, data.direction, data.dims))
        cut = rows_data(spec, data, symbol, ranges)
        if cut is None:
            return
        got = {slot.name: take(out_a[slot.name], ranges) for slot in cut.outputs}
        del out_a
        shown = ", ".join(f"{a}..{b - 1}" for a, b in ranges)
        check_close(cut, got, prefix=f"on rows {shown} of {symbol} (the truth computed for those rows only; "
                                     f"row indices below count within them): ")
