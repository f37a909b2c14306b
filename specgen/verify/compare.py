"""Comparing a kernel's outputs with the float64 truth, and saying where they differ.

The rule, element by element (docs/VERIFIER.md "Tolerance"):

    |got - truth| <= atol + (rtol + eps) * |truth| + widening

`atol`/`rtol` are the spec's, `eps` is the working dtype's machine epsilon (the output's own
rounding), and the widening comes from the spec's reference run in the working dtype (see
`widening_rule`): twice its error at that element, and a floor proportional to |truth| + RMS(truth)
sized by its largest error relative to that scale. A large error at a large value buys no
slack at a small one; an error that does not scale with the value (a long sum's) does.

Non-finite values: where the truth is NaN or +-Inf the output must be the same NaN or the
same infinity (NaN positions match). Where the true value lies beyond the working dtype's
range (float16: 65504), the infinity it rounds to is right. Where the reference itself
returns a non-finite value at a finite truth (the working dtype overflowed inside the
reference), any non-finite value is accepted at that element. NaN where both are finite always fails.
"""
from __future__ import annotations

import math
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


CHUNK_ELEMENTS = 1 << 26  # compared a slice at a time: a 1e9-element output's float64 temporaries
# would take tens of GB (the H200's full-size cases ran out of memory in the comparison)


def chunks(*tensors, size: int | None = None):
    """Matching flat slices of same-shaped tensors (None stays None)."""
    size = size or CHUNK_ELEMENTS
    flat = [t.reshape(-1) if isinstance(t, torch.Tensor) else None for t in tensors]
    total = next(t.numel() for t in flat if t is not None)
    for start in range(0, max(total, 1), size):
        yield start, [t[start:start + size] if t is not None else None for t in flat]


@dataclass(frozen=True)
class Widening:
    """The slack the reference's own error buys, as a rule with its global scalars, so that it
    can be applied a slice at a time (see `widening_rule`)."""
    mode: str = "none"  # none | relative (the reference only rounds) | scaled
    factor: float = 0.0
    scale: float = 0.0

    def at(self, reference: torch.Tensor | None, truth: torch.Tensor) -> torch.Tensor | float:
        if self.mode == "none" or reference is None:
            return 0.0
        t = truth.double()
        err = (reference.to(truth.device).double() - t).abs()
        err = torch.where(torch.isfinite(err), err, torch.zeros_like(err))
        if self.mode == "relative":
            return torch.maximum(REFERENCE_ERROR_FACTOR * err, FLOOR_FACTOR * self.factor * t.abs())
        return torch.maximum(REFERENCE_ERROR_FACTOR * err, FLOOR_FACTOR * self.factor * (t.abs() + self.scale))


def widening_rule(reference: torch.Tensor | None, truth: torch.Tensor) -> Widening:
    """Two parts, the larger wins (0 where either is not finite; those elements have their own rule):
    - 2 x the reference's error at that very element;
    - a floor: where every error of the reference stays under 8 eps x |value| (it only rounds),
      4 x that largest relative error x |truth| (small outputs keep a small tolerance, and
      large values elsewhere buy nothing); otherwise (errors that do not scale with the value:
      a long sum's rounding depends on its terms, not on the result) 4 x R x (|truth| + S),
      with S the RMS of the truth and R the largest error relative to (|truth| + S).
    The scalars are gathered a slice at a time."""
    if reference is None or not reference.is_floating_point():
        return Widening()
    info = torch.finfo(reference.dtype)
    relative_to_value, any_normal, squares, count = 0.0, False, 0.0, 0

    def finite_parts(r, t):
        err = (r.to(t.device).double() - t.double()).abs()
        finite = torch.isfinite(err)
        return err[finite], t.double()[finite].abs()

    for _, (r, t) in chunks(reference, truth):
        err, values = finite_parts(r, t)
        if not values.numel():
            continue
        normal = values > 1e3 * info.smallest_normal
        if bool(normal.any()):
            any_normal = True
            relative_to_value = max(relative_to_value, float((err[normal] / values[normal]).max()))
        squares += float(values.pow(2).sum())
        count += values.numel()
    if not count:
        return Widening()
    if any_normal and relative_to_value <= ROUNDING_EPS * info.eps:  # the reference only rounds
        return Widening("relative", relative_to_value)
    scale = (squares / count) ** 0.5 or 1e-300
    relative = 0.0
    for _, (r, t) in chunks(reference, truth):
        err, values = finite_parts(r, t)
        if values.numel():
            relative = max(relative, float((err / (values + scale)).max()))
    return Widening("scaled", relative, scale)


def element_tolerance(got_dtype: torch.dtype, truth: torch.Tensor, atol: float, rtol: float,
                      reference: torch.Tensor | None = None, widen=None) -> torch.Tensor:
    """The tolerance of every element (`widen`: a Widening rule, or its values when already known)."""
    eps = torch.finfo(got_dtype).eps if got_dtype.is_floating_point else 0.0
    t = truth.double()
    widen = widening_rule(reference, truth) if widen is None else widen
    if isinstance(widen, Widening):
        widen = widen.at(reference, truth)
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
            reference: torch.Tensor | None = None, tolerance=None, nonfinite_any: bool = False) -> torch.Tensor:
    """Per element: does a floating output match the float64 truth (see the module's doc)?
    `tolerance`: element_tolerance(...) of these very arguments when already computed, or the
    Widening rule. Large outputs are compared a slice at a time."""
    if tolerance is None:
        tolerance = widening_rule(reference, truth)
    out = torch.empty(got.shape, dtype=torch.bool, device=got.device)
    flat = out.view(-1)
    tol = tolerance if isinstance(tolerance, torch.Tensor) else None
    for start, (g, t, ref, tol_part) in chunks(got, truth, reference, tol):
        if tol_part is None:
            tol_part = element_tolerance(got.dtype, t, atol, rtol, ref, widen=tolerance.at(ref, t))
        flat[start:start + g.numel()] = _matches(g, t, atol, rtol, ref, tol_part, nonfinite_any)
    return out


def _matches(got, truth, atol, rtol, reference, tolerance, nonfinite_any: bool = False) -> torch.Tensor:
    g, t = got.double(), truth.double()
    within = torch.isfinite(g) & ((g - t).abs() <= tolerance)
    # The truth rounded to the working dtype: a correct kernel's result, ±inf past the range.
    as_rounded = g == t.to(got.dtype).double()
    # An infinity that a value within tolerance of the truth rounds to (65510 ± 1e-3*65510).
    spec_band = atol + rtol * t.abs()  # the spec's own band: rounding slack does not reach past the range
    band_edge = t + torch.where(g > 0, spec_band, -spec_band)
    rounds_to_it = torch.isinf(g) & (band_edge.to(got.dtype).double() == g)
    good = within | as_rounded | rounds_to_it
    # Non-finite truth: the same NaN / the same infinity.
    same_special = (torch.isnan(t) & torch.isnan(g)) | (torch.isinf(t) & (g == t))
    if reference is not None and reference.is_floating_point():
        # The reference went non-finite where the truth is finite: at that element (only) its
        # value is as good an answer as the kernel can owe.
        ref = reference.to(g.device).double()
        good |= ~torch.isfinite(ref) & ~torch.isfinite(g)  # the working dtype overflowed: any inf/NaN
        # A non-finite truth the reference itself misses in the working dtype (float64 keeps
        # 1 - sigmoid(20) > 0, float32 rounds it to 0, and inf * 0 is NaN): its own NaN or
        # infinity there, exactly, as good as the truth's
        same_special |= ~torch.isfinite(ref) & ((torch.isnan(ref) & torch.isnan(g)) | (g == ref))
    if nonfinite_any:  # NaN or an infinity among the output gradients (data.output_gradient)
        same_special |= ~torch.isfinite(g)  # any non-finite answer to a non-finite truth
        # and to an exact 0: torch's masks pick 0 (where(x > 0, g, 0)), a kernel that multiplies
        # by the mask gives NaN there; either way the step's gradients hold a NaN for the scaler
        good |= (t == 0) & ~torch.isfinite(g)
    return torch.where(torch.isfinite(t), good, same_special)


def compare(got: torch.Tensor, truth: torch.Tensor, atol: float, rtol: float,
            reference: torch.Tensor | None = None, tolerance=None,
            alternative: torch.Tensor | None = None, nonfinite_any: bool = False) -> Mismatch | None:
    """None when every element matches: within tolerance, or (overflow) the infinity a correct
    kernel returns; NaN/Inf must match a non-finite truth exactly (`nonfinite_any`, a backward
    case whose output gradients hold NaN/inf: any non-finite value matches a non-finite truth or
    an exact 0). `reference`: the reference's
    outputs in the working dtype, whose own overflows are accepted element by element.
    `alternative`: a second truth (the CPU's, data.alternative_truth); where it differs from
    `truth`, matching it is as good (the spec's own tolerance, no widening)."""
    if not got.is_floating_point():
        bad = got.to(truth.dtype) != truth
    else:
        bad = matches(got, truth, atol, rtol, reference, tolerance, nonfinite_any).logical_not()
        if alternative is not None and bool(bad.any()):
            differs = (alternative != truth) & ~(torch.isnan(alternative) & torch.isnan(truth))
            bad &= ~(differs & matches(got, alternative, atol, rtol, nonfinite_any=nonfinite_any))
    count = int(bad.sum())
    if count == 0:
        return None
    # The worst element (the largest error, or the first non-finite one) and the largest
    # errors, a slice at a time.
    max_abs = max_rel = 0.0
    best, flat, nans, infs = -2.0, 0, 0, 0
    for start, (g, t, b) in chunks(got, truth, bad):
        g, t = g.double(), t.double()
        err = (g - t).abs()
        finite_err = torch.where(torch.isfinite(err), err, torch.zeros_like(err))
        if finite_err.numel():
            max_abs = max(max_abs, float(finite_err.max()))
            rel = torch.nan_to_num(finite_err / t.abs().clamp_min(1e-30), nan=0.0)  # a NaN truth: no relative error
            max_rel = max(max_rel, float(torch.where(b, rel, torch.zeros_like(rel)).max()))
        score = torch.where(b, torch.where(torch.isfinite(err), err, torch.full_like(err, float("inf"))),
                            torch.full_like(err, -1.0))
        at = int(score.argmax()) if score.numel() else 0
        if score.numel() and float(score[at]) > best:
            best, flat = float(score[at]), start + at
        if got.is_floating_point():
            nonfinite = b & ~torch.isfinite(g) & torch.isfinite(t)
            chunk_nans = int((nonfinite & torch.isnan(g)).sum())
            nans += chunk_nans
            infs += int(nonfinite.sum()) - chunk_nans
    index = list(unravel(flat, tuple(got.shape)))
    expected = float(truth.reshape(-1)[flat])
    value = float(got.reshape(-1)[flat].double())
    where = locate(bad)
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


# ------------------------------------------------------------------ rounding direction (verifier version 13)
#
# A 16-bit output rounded in one direction (truncation: the upper 16 bits of the float32, i.e.
# toward zero; or toward +inf / -inf) errs by less than an ulp, inside any per-element tolerance,
# but a stream of layers composes the bias: held-out attacks-v10's fused add + RMSNorm truncated its
# residual_out, and a deep model's residual stream shrank ~0.25% per layer. Round-to-nearest errs
# either way about half the time, so the share of errors in one direction tells them apart.
#
# The rule, and why it spares honest kernels (false positives weighed one by one):
# - only float16/bfloat16 outputs: a float32 output's tolerance is many ulps wide, and an honest
#   float32 kernel may err with a consistent sign (its order of summation);
# - only elements whose truth is finite and normal in the dtype (smallest_normal <= |truth| <= max):
#   no overflow to inf or saturation at max, no underflow to 0 or subnormals (a flush-to-zero or
#   a value class of "huge"/"tiny"/special inputs is not a rounding); the kernel's value finite;
# - only inexact elements (got != truth): exactly representable results carry no direction;
# - only errors of at most MAX_ERROR_EPS x eps x |truth| (4-8 ulps): a rounding errs by an ulp or
#   two (torch's several roundings); larger errors (cancellation, an intermediate that underflowed,
#   an approximation) are the computation's, not the rounding's. The cut is symmetric in the sign
#   of the error, so it adds no bias of its own;
# - at least MIN_BIASED such elements (the shares' noise is then ~0.011);
# - an output of two or more dimensions with at least MIN_GROUPS rows (along the last dim) and
#   MIN_GROUPS columns among those elements. A kernel that rounds a shared intermediate to 16 bits
#   (a row's rsqrt or 1/sum packed into a bfloat162 for __hmul2) shifts that whole row's errors one
#   way: one row in ten then looks truncated (a share past 0.95), three rows averaged pass 0.75 one
#   time in seven; over 48 rows (or columns, for a per-column scale) the random shifts average out
#   (share sd 0.042, 6 sd from the bound; 64 would miss [N, 64] outputs with a few columns all 0).
#   The verifier's wide-row cases have 3 rows and are not judged; each value class also comes at
#   mid and aligned shapes of many rows, which are. 1-D and 0-d outputs (one row, or a weight's
#   gradient) are not judged;
# - a share toward zero (|got| < |truth|) or upward (got > truth) above 1 - BIAS_BOUND or below
#   BIAS_BOUND: round-to-nearest-even gives ~1/2 (a kernel computing in float32 and rounding once,
#   or rounding several times as torch does in 16-bit: ties to even split both ways), truncation
#   gives ~1 toward zero;
# - unless an answer an honest kernel may give is as biased: the truth rounded to nearest (data
#   whose correct rounding leans one way by itself: x + a tiny positive y that rounds back to x) or
#   the reference in the working dtype (torch's own intermediate roundings: a constant or a row's
#   scale rounded to 16 bits, and that on rows drawn alike); either excuses the kernel when it errs
#   on at least half as many elements and its share lies on the same side of 1/2, at least half as
#   far from it (a kernel that follows some of torch's roundings leans up to twice as far).
# Scanned on the CPU (session scratch, not a test) over every spec in specs/ and the verifier's
# boundary cases, forward and backward, float16 and bfloat16 (6812 outputs): a float32-math kernel
# rounding once never fails, torch's own 16-bit reference leans past the bound once (log_softmax,
# float16 "tiny": 0.88 toward zero) and is excused by itself; a kernel rounding each row's scale to
# 16 bits (in float32 math or __hmul2; rmsnorm, 4 seeds) never fails; a truncating one fails every
# judged case but those where rounding to nearest leans as far by itself (rope's "mask-min", an
# "identity" layernorm_gelu case).
# Large outputs: a strided sample of at most SAMPLE_ELEMENTS elements, vectorized torch ops only.
MIN_BIASED = 2000
BIAS_BOUND = 0.25
MAX_ERROR_EPS = 4.0
MIN_GROUPS = 48
SAMPLE_ELEMENTS = 1 << 22
ROUNDED_DTYPES = (torch.float16, torch.bfloat16)

_DIRECTIONS = {
    "toward zero": ("toward zero (|got| < |truth|): truncation instead of round-to-nearest-even, e.g. keeping the "
                    "upper 16 bits of the float32 (bits >> 16) or a _rz conversion", "shrinks"),
    "away from zero": ("away from zero (|got| > |truth|): e.g. adding half an ulp (0x8000) before keeping the upper "
                       "16 bits rounds ties away from zero, or a rounding up in magnitude", "grows"),
    "upward": ("upward, toward +inf (got > truth): a _ru conversion or a rounding up", "drifts upward"),
    "downward": ("downward, toward -inf (got < truth): a _rd conversion or a rounding down", "drifts downward"),
}


@dataclass
class RoundingBias:
    """A 16-bit output whose errors go one way (see `rounding_bias`)."""
    direction: str  # a key of _DIRECTIONS
    fraction: float  # the share of the judged elements that err that way
    biased: int  # how many of them do
    elements: int  # the judged elements: inexact, truth normal, error a rounding's
    sampled: int  # the elements looked at (a strided sample of a large output)
    total: int
    index: list[int]  # an element that errs that way
    expected: float
    got: float
    dtype: str = ""

    def describe(self, name: str) -> str:
        how, effect = _DIRECTIONS[self.direction]
        looked = (f"{self.sampled} of the {self.total} elements, a strided sample" if self.sampled < self.total
                  else f"the {self.total} elements")
        return (f"output {name!r} is rounded in one direction: {self.fraction:.1%} of its {self.elements} inexact "
                f"elements (of {looked}; inexact: the float64 truth a normal {self.dtype} value that the output "
                f"does not hold exactly) err {how}, where round-to-nearest-even errs either way about half the "
                f"time (a share outside [{BIAS_BOUND:g}, {1 - BIAS_BOUND:g}] over at least {MIN_BIASED} elements "
                f"fails). Each element is within the tolerance, but a stream of layers composes the bias: where "
                f"this output feeds the next layer, 32-80 times over (a deep model's residual stream), the stream "
                f"{effect} layer after layer. Round to nearest even when packing {self.dtype}: __float2bfloat16_rn / "
                f"__float2half_rn (__floats2bfloat162_rn / __floats2half2_rn for pairs), not the upper 16 bits "
                f"of the float32 nor a _rz/_ru/_rd conversion. If it already rounds to nearest, look for an "
                f"intermediate rounded to {self.dtype} that the reference keeps in float32 (a row's scale): "
                f"it shifts every element it scales one way")


def _sample(tensor: torch.Tensor, step: int, device) -> torch.Tensor:
    return tensor.reshape(-1)[::step].to(device)


def _judged(value: torch.Tensor, truth: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The elements whose error is a rounding's: truth finite and normal in `dtype`, the value
    finite, inexact, within MAX_ERROR_EPS x eps x |truth| (float64 operands)."""
    info = torch.finfo(dtype)
    size = truth.abs()
    err = (value - truth).abs()
    return ((size >= info.smallest_normal) & (size <= info.max) & torch.isfinite(value)
            & (err > 0) & (err <= MAX_ERROR_EPS * info.eps * size))


def _shares(value: torch.Tensor, truth: torch.Tensor, dtype: torch.dtype):
    """(judged mask, count, share toward zero, share upward)."""
    judged = _judged(value, truth, dtype)
    count = int(judged.sum())
    if not count:
        return judged, 0, 0.5, 0.5
    toward_zero = int((judged & (value.abs() < truth.abs())).sum())
    upward = int((judged & (value > truth)).sum())
    return judged, count, toward_zero / count, upward / count


def rounding_bias(got: torch.Tensor, truth: torch.Tensor, reference: torch.Tensor | None = None) -> RoundingBias | None:
    """None unless a float16/bfloat16 output's errors go one way (the rule above): `truth` the
    float64 (or a lean case's float32) truth, `reference` the reference's output in the working
    dtype (None, or the truth standing for it in a lean case: not a baseline then)."""
    width = got.shape[-1] if got.dim() else 1
    total = got.numel()
    if (got.dtype not in ROUNDED_DTYPES or not truth.is_floating_point() or total < MIN_BIASED
            or got.dim() < 2 or width < MIN_GROUPS or total // width < MIN_GROUPS):
        return None
    step = -(-total // SAMPLE_ELEMENTS)
    while math.gcd(step, width) != 1:  # a step sharing a factor with the width would see some columns only
        step += 1
    device = got.device
    g, t = _sample(got, step, device).double(), _sample(truth, step, device).double()
    judged, count, toward_zero, upward = _shares(g, t, got.dtype)
    if count < MIN_BIASED:
        return None
    positions = torch.arange(0, total, step, device=device)[judged]
    if (torch.unique(torch.div(positions, width, rounding_mode="floor")).numel() < MIN_GROUPS
            or torch.unique(positions % width).numel() < MIN_GROUPS):
        return None
    leaning = [(abs(share - 0.5), kind, share) for kind, share in (("zero", toward_zero), ("up", upward))
               if abs(share - 0.5) > 0.5 - BIAS_BOUND]
    if not leaning:
        return None
    baselines = [t.to(got.dtype).double()]  # the truth rounded to nearest: a correct kernel's answer
    if isinstance(reference, torch.Tensor) and reference.dtype == got.dtype and reference.shape == got.shape:
        baselines.append(_sample(reference, step, device).double())
    shares = [_shares(b, t, got.dtype)[1:] for b in baselines]

    def excused(kind: str, share: float) -> bool:
        for n, zero, up in shares:
            other = zero if kind == "zero" else up
            if (n >= count / 2 and (other - 0.5) * (share - 0.5) > 0
                    and abs(other - 0.5) >= abs(share - 0.5) / 2):
                return True
        return False

    for _, kind, share in sorted(leaning, reverse=True):
        if excused(kind, share):
            continue
        if kind == "zero":
            direction = "toward zero" if share > 0.5 else "away from zero"
            way = (g.abs() < t.abs()) if share > 0.5 else (g.abs() > t.abs())
        else:
            direction = "upward" if share > 0.5 else "downward"
            way = (g > t) if share > 0.5 else (g < t)
        way &= judged
        at = int(way.nonzero()[0])
        return RoundingBias(direction, max(share, 1 - share), int(way.sum()), count, g.numel(), total,
                            list(unravel(at * step, tuple(got.shape))), float(t[at]), float(g[at]),
                            str(got.dtype).replace("torch.", ""))
    return None
