"""Comparing a kernel's outputs with the float64 truth, and saying where they differ.

The rule, element by element (docs/VERIFIER.md "Tolerance"):

    |got - truth| <= atol + (rtol + eps) * |truth| + widening

`atol`/`rtol` are the spec's, `eps` is the working dtype's machine epsilon (the output's own
rounding), and the widening comes from the spec's reference run in the working dtype (see
`widening`): twice its error at that element, and a floor proportional to |truth| + RMS(truth)
sized by its largest error relative to that scale. A large error at a large value buys no
slack at a small one; an error that does not scale with the value (a long sum's) does.

Non-finite values: where the truth is NaN or +-Inf the output must be the same NaN or the
same infinity (NaN positions match). Where the true value lies beyond the working dtype's
range (float16: 65504), the infinity it rounds to is right. Where the reference itself
returns a non-finite value at a finite truth (the working dtype overflowed inside the
reference), any non-finite value is accepted at that element. NaN where both are finite always fails.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

REFERENCE_ERROR_FACTOR = 2.0
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as integers: NaN == NaN and -0 != +0, as a bitwise check wants."""
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bool:
        return tensor.view(torch.uint8)
    return tensor.view(_INT_VIEW[tensor.element_size()])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits(a), bits(b)))


def differing_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mask of elements whose bits differ."""
    return bits(a) != bits(b)


FLOOR_FACTOR = 4.0
ROUNDING_EPS = 8.0  # a reference whose errors all stay under 8 eps x |value| only rounds


def widening(reference: torch.Tensor | None, truth: torch.Tensor) -> torch.Tensor | float:
    """Per element: the slack the reference's own error buys (0 where either is not finite;
    those elements have their own rule). Two parts, the larger wins:
    - 2 x the reference's error at that very element;
    - a floor: where every error of the reference stays under 8 eps x |value| (it only rounds),
      4 x that largest relative error x |truth| (small outputs keep a small tolerance, and
      large values elsewhere buy nothing); otherwise (errors that do not scale with the value:
      a long sum's rounding depends on its terms, not on the result) 4 x R x (|truth| + S),
      with S the RMS of the truth and R the largest error relative to (|truth| + S)."""
    if reference is None or not reference.is_floating_point():
        return 0.0
    ref = reference.to(truth.device).double()
    t = truth.double()
    err = (ref - t).abs()
    finite = torch.isfinite(err)
    err = torch.where(finite, err, torch.zeros_like(err))
    if not bool(finite.any()):
        return err
    values = t[finite].abs()
    info = torch.finfo(reference.dtype)
    normal = values > 1e3 * info.smallest_normal
    if bool(normal.any()):
        relative_to_value = float((err[finite][normal] / values[normal]).max())
        if relative_to_value <= ROUNDING_EPS * info.eps:  # the reference only rounds: slack relative to each value
            return torch.maximum(REFERENCE_ERROR_FACTOR * err, FLOOR_FACTOR * relative_to_value * t.abs())
    scale = float(values.pow(2).mean().sqrt()) or 1e-300
    relative = float((err[finite] / (values + scale)).max())
    return torch.maximum(REFERENCE_ERROR_FACTOR * err, FLOOR_FACTOR * relative * (t.abs() + scale))


def element_tolerance(got_dtype: torch.dtype, truth: torch.Tensor, atol: float, rtol: float,
                      reference: torch.Tensor | None = None, widen=None) -> torch.Tensor:
    """The tolerance of every element (`widen`: widening(reference, truth) when already known)."""
    eps = torch.finfo(got_dtype).eps if got_dtype.is_floating_point else 0.0
    t = truth.double()
    widen = widening(reference, truth) if widen is None else widen
    if isinstance(widen, torch.Tensor):
        widen = torch.where(torch.isfinite(widen), widen, torch.zeros_like(widen))
    return atol + (rtol + eps) * t.abs() + widen


@dataclass
class Mismatch:
    bad: int
    total: int
    max_abs: float
    max_rel: float
    index: list[int]
    expected: float
    got: float
    where: list[str] = field(default_factory=list)


def matches(got: torch.Tensor, truth: torch.Tensor, atol: float, rtol: float,
            reference: torch.Tensor | None = None, tolerance: torch.Tensor | None = None) -> torch.Tensor:
    """Per element: does a floating output match the float64 truth (see the module's doc)?
    `tolerance`: element_tolerance(...) of these very arguments, when already computed."""
    g, t = got.double(), truth.double()
    if tolerance is None:
        tolerance = element_tolerance(got.dtype, truth, atol, rtol, reference)
    within = torch.isfinite(g) & ((g - t).abs() <= tolerance)
    # The truth rounded to the working dtype: a correct kernel's result, ±inf past the range.
    as_rounded = g == t.to(got.dtype).double()
    # An infinity that a value within tolerance of the truth rounds to (65510 ± 1e-3*65510).
    spec_band = atol + rtol * t.abs()  # the spec's own band: rounding slack does not reach past the range
    band_edge = t + torch.where(g > 0, spec_band, -spec_band)
    rounds_to_it = torch.isinf(g) & (band_edge.to(got.dtype).double() == g)
    good = within | as_rounded | rounds_to_it
    if reference is not None and reference.is_floating_point():
        # The reference went non-finite where the truth is finite: at that element (only) its
        # value is as good an answer as the kernel can owe.
        ref = reference.to(g.device).double()
        good |= ~torch.isfinite(ref) & ~torch.isfinite(g)  # the working dtype overflowed: any inf/NaN
    # Non-finite truth: the same NaN / the same infinity.
    same_special = (torch.isnan(t) & torch.isnan(g)) | (torch.isinf(t) & (g == t))
    return torch.where(torch.isfinite(t), good, same_special)


def compare(got: torch.Tensor, truth: torch.Tensor, atol: float, rtol: float,
            reference: torch.Tensor | None = None, tolerance: torch.Tensor | None = None) -> Mismatch | None:
    """None when every element matches: within tolerance, or (overflow) the infinity a correct
    kernel returns; NaN/Inf must match a non-finite truth exactly. `reference`: the reference's
    outputs in the working dtype, whose own overflows are accepted element by element."""
    if not got.is_floating_point():
        bad = got.to(truth.dtype) != truth
        err = (got.double() - truth.double()).abs()
    else:
        err = (got.double() - truth.double()).abs()
        bad = matches(got, truth, atol, rtol, reference, tolerance).logical_not()
    count = int(bad.sum())
    if count == 0:
        return None
    finite_err = torch.where(torch.isfinite(err), err, torch.zeros_like(err))
    max_abs = float(finite_err.max()) if finite_err.numel() else 0.0
    rel = finite_err / truth.double().abs().clamp_min(1e-30)
    max_rel = float(torch.where(bad, rel, torch.zeros_like(rel)).max())
    # The worst element: the largest error, or the first non-finite one.
    score = torch.where(bad, torch.where(torch.isfinite(err), err, torch.full_like(err, float("inf"))),
                        torch.full_like(err, -1.0))
    flat = int(score.flatten().argmax())
    index = list(unravel(flat, tuple(got.shape)))
    expected = float(truth.flatten()[flat])
    value = float(got.flatten()[flat].double())
    where = locate(bad)
    if got.is_floating_point():
        nonfinite = bad & ~torch.isfinite(got.double()) & torch.isfinite(truth.double())
        nans = int((nonfinite & torch.isnan(got.double())).sum())
        infs = int(nonfinite.sum()) - nans
        if nans:
            where.append(f"NaN in {nans} element(s) where the reference is finite")
        if infs:
            limit = torch.finfo(got.dtype).max
            where.append(f"Inf in {infs} element(s) where the reference is finite and within "
                         f"{str(got.dtype).replace('torch.', '')}'s range (max {limit:.6g}): compute in "
                         f"float32 and round once at the store")
    return Mismatch(count, bad.numel(), max_abs, max_rel, index, expected, value, where)


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size if size else 0)
        flat //= size if size else 1
    return tuple(reversed(index))


def locate(mask: torch.Tensor) -> list[str]:
    """Where the True elements of a mask lie, in words: tail, first row, columns, every row."""
    total = mask.numel()
    count = int(mask.sum())
    if count == 0 or total == 0:
        return []
    if mask.dim() == 0:
        return ["the 0-d output"]
    flat = mask.flatten()
    positions = flat.nonzero().flatten()
    first, last = int(positions[0]), int(positions[-1])
    where: list[str] = []
    if count == total:
        return ["every element"]
    if last == total - 1 and count == total - first:
        where.append(f"tail: flat elements {first}..{total - 1} of {total}")
    elif first == 0 and count == last + 1:
        where.append(f"head: flat elements 0..{last} of {total}; the rest is fine")
    if mask.dim() >= 2:
        rows = mask.reshape(-1, mask.shape[-1])
        bad_rows = rows.any(dim=1).nonzero().flatten()
        bad_cols = rows.any(dim=0).nonzero().flatten()
        n_rows, width = rows.shape
        r0, r1 = int(bad_rows[0]), int(bad_rows[-1])
        c0, c1 = int(bad_cols[0]), int(bad_cols[-1])
        if r0 == r1:
            where.append("first row only" if r0 == 0 else f"row {r0} only")
        elif len(bad_rows) == n_rows:
            where.append(f"every row ({n_rows})")
        else:
            where.append(f"{len(bad_rows)} of {n_rows} rows (rows {r0}..{r1})")
        if c0 > 0 and c1 == width - 1 and r0 != r1:
            where.append(f"the end of each row: columns {c0}..{width - 1} of {width}")
        elif len(bad_cols) < width:
            where.append(f"columns {c0}..{c1} of {width}")
    elif not where:
        where.append(f"flat elements {first}..{last} of {total}")
    return where


def unwritten(out_a: torch.Tensor, out_b: torch.Tensor, fill_a: torch.Tensor, fill_b: torch.Tensor) -> torch.Tensor:
    """Elements left unwritten: still fill A after the run filled with A, and still fill B after
    the run filled with B. A correct NaN result is NaN in both runs, so it is not confused."""
    return (bits(out_a) == bits(fill_a)) & (bits(out_b) == bits(fill_b))
