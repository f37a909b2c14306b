"""Concrete inputs for a signature: sizes for its dims, tensors in several value distributions.

Shared by `specgen check` (small CPU inputs), the verifier and the benchmark, so all of
them agree on what a valid input is.
"""
from __future__ import annotations

import math
import random
from typing import Iterable

import torch

from .signature import Param, Signature, TensorType

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}

# What the verifier draws values from. The last four are the value classes kernels get
# wrong on purpose or by accident: NaN and +-Inf among normal values, magnitudes from 1e3 up
# to 1e15 (a tenth of the range in float16), subnormals among normal values, and a model's
# activations: normal values with rare elements 1e3-1e4 times larger (massive activations), so
# whole tiles of ordinary values are tiny next to the tensor's largest. "rounded": normal values
# that came from a lower precision (rounded to bfloat16, as autocast outputs and bf16
# checkpoints upcast to float32 are: their low mantissa bits are zero). "quantized": normal values
# on FP8 E4M3's grid (3 mantissa bits, |x| <= 448), as FP8 weights and activations dequantized for
# serving are. "sparse": a ReLU's outputs (normal values with the negative half exactly 0), the
# input of the next layer. "masked": attention scores under a mask: each row (along the last dim)
# normal values with a contiguous run of -inf at its start or end (left padding, a causal or
# sliding-window mask), shorter than the row; some rows -inf at both ends (left padding and a
# causal mask together) and some -inf throughout (a padded query row: torch's softmax gives NaN
# there). "int8": int8-quantized activations dequantized (W8A8, QAT): each row on the grid of its
# absmax / 127. "repeated": near-duplicate rows (the rows of a padded batch, a causal mask's
# consecutive rows): each row the one before it with 1-3 elements drawn anew, away from its ends.
# "mask-min": "masked" with the dtype's most negative finite value in place of -inf (Hugging Face's
# eager attention adds torch.finfo(dtype).min: a fully masked row is then uniform, not NaN).
# "identity": parameters at their initial values and tables at their identity rows: each floating
# input of lower rank than the largest (a weight, a bias, a cos/sin table) holds one constant, 1 or
# 0 by its place in the signature and the seed (identity_constant), whole if it has one dim, else in
# its first row and every fourth row after it (position 0 of a rotary table is cos 1, sin 0); the
# other inputs normal values. "offset": uncentred rows: each row (along the last dim) normal values
# plus one offset of 20 to 63 in magnitude (either sign), so a row's mean is 20-63 times its
# spread (uncentred features, offset embeddings, constant padding rows: where a one-pass variance,
# E[x^2] - mean^2 in float32, cancels; OFFSET_LOG10). "zero-rows": normal values with rows 1, 4, 7, ... (along the
# last dim) exactly zero (hidden states multiplied by an attention mask: a norm's max or sum of
# squares is 0 there, and torch gives 0, not NaN).
DISTRIBUTIONS = ("normal", "large", "tiny", "negative", "uniform", "specials", "huge", "denormal", "outliers",
                 "rounded", "quantized", "sparse", "masked", "int8", "repeated", "mask-min", "identity",
                 "offset", "zero-rows")
SPECIAL_FRACTION = 0.02  # of the elements each: NaN, +Inf, -Inf ("specials")
# "infinities": +Inf and -Inf only, drawn in place of "specials" for a reference that refuses NaN
# but takes infinities (verify/domain.py: sigmoid(+-inf) is a probability, sigmoid(NaN) is not)
FALLBACKS = {"specials": "infinities"}
# "huge" stops at 1e15 in float32/bfloat16: a row's sum of squares stays finite in a float32
# accumulator (overflow at the edge of the range is the "specials" class's business, not this one's)
HUGE_TOP_LOG10 = 15.0
# "offset": each row's offset is 10^u in magnitude, u uniform in this range (20 to 63 times the spread):
# a one-pass float32 variance errs past a float32 tolerance from about 30 (attacks-v9's note), while an
# honest two-pass or Welford kernel, whose mean is off by an ulp or two of the offset, stays within it
# to about 100 (at 1000 an honest float32 LayerNorm's stand-in erred 5e-5 against atol 1e-5)
OFFSET_LOG10 = (1.3, 1.8)
ZERO_ROWS_EVERY = 3  # "zero-rows": rows 1, 4, 7, ... exactly zero
OUTLIER_FRACTION = 1e-3  # of the elements, at least one per tensor ("outliers")


def default_scalar(param: Param):
    if param.has_default:
        return param.default
    return {"float": 0.5, "int": 1, "bool": False}[param.type.kind]


def scalar_range(param: Param) -> tuple[float, float] | None:
    """The closed range the verifier draws a scalar from; None: always its default.

    `in [lo, hi]` in the signature, else for a float with a nonzero default d the decade
    around it ([d/10, 10d], same sign), for a float without a default [0.05, 5]; int scalars
    only with an explicit range; bools take both values (handled by the caller)."""
    if param.value_range is not None:
        return param.value_range
    if param.type.kind != "float":
        return None
    if not param.has_default:
        return (0.05, 5.0)
    d = float(param.default)
    if d == 0 or d != d or d in (float("inf"), float("-inf")):
        return None
    return (d / 10, d * 10) if d > 0 else (d * 10, d / 10)


def draw_scalar(param: Param, rng: random.Random):
    """One value of a scalar for a verification case: log-uniform over a positive range."""
    import math

    if param.type.kind == "bool":
        return rng.random() < 0.5
    bounds = scalar_range(param)
    if bounds is None:
        return default_scalar(param)
    lo, hi = bounds
    if param.type.kind == "int":
        return rng.randint(int(lo), int(hi))
    if lo > 0:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    if hi < 0:
        return -math.exp(rng.uniform(math.log(-hi), math.log(-lo)))
    return rng.uniform(lo, hi)


def first_multiple(lo: int, step: int) -> int:
    """The smallest multiple of `step` at or above `lo` (a size the signature's divisibility allows)."""
    return -(-lo // step) * step


def sample_dims(sig: Signature, ranges: dict[str, tuple[int, int]], rng: random.Random,
                cap: int | None = None) -> dict[str, int]:
    """Random sizes within the ranges (capped at `cap` for small checks), honouring divisibility."""
    divisors = sig.symbol_divisors()
    dims = {}
    for symbol in sig.symbols():
        lo, hi = ranges[symbol]
        if cap is not None:
            hi = max(lo, min(hi, cap))
        step = divisors.get(symbol, 1)
        first = first_multiple(lo, step)
        last = hi // step * step
        if last < first:  # the cap cut below the first multiple: take the smallest legal one
            last = first
        dims[symbol] = rng.randrange(first, last + 1, step)
    return dims


def _values(shape: tuple[int, ...], distribution: str, gen: torch.Generator, dtype_name: str = "float32"
            ) -> torch.Tensor:
    device = gen.device
    base = torch.randn(shape, generator=gen, dtype=torch.float64, device=device)
    if distribution in ("specials", "infinities", "huge", "denormal"):
        u = torch.rand(shape, generator=gen, dtype=torch.float64, device=device)
        info = torch.finfo(TORCH_DTYPES[dtype_name]) if dtype_name in TORCH_DTYPES else torch.finfo(torch.float32)
        if distribution in ("specials", "infinities"):
            return with_specials(base, u, nan=distribution == "specials")
        if distribution == "huge":  # log-uniform magnitudes from 1e3 up to HUGE_TOP (or a tenth of the range)
            import math

            top = min(math.log10(info.max) - 1, HUGE_TOP_LOG10)
            return torch.sign(base) * torch.pow(10.0, 3 + u * max(top - 3, 0.5))
        # denormal: half the elements subnormal in the working dtype, the rest normal
        tiny = torch.rand(shape, generator=gen, dtype=torch.float64, device=device) * info.smallest_normal
        return torch.where(u < 0.5, torch.sign(base) * tiny, base)
    if distribution == "rounded":
        return base.to(torch.bfloat16).to(torch.float64)
    if distribution == "quantized":
        return base.to(torch.float8_e4m3fn).to(torch.float64)
    if distribution == "sparse":
        return base.clamp_min(0.0)
    if distribution == "masked":
        return _masked(base, gen)
    if distribution == "mask-min":
        info = torch.finfo(TORCH_DTYPES[dtype_name]) if dtype_name in TORCH_DTYPES else torch.finfo(torch.float32)
        return _masked(base, gen, fill=float(info.min))
    if distribution == "identity":  # the constants are set by make_inputs, which knows the signature
        return base
    if distribution == "repeated":
        return _repeated(base, gen, dtype_name)
    if distribution == "offset":
        return _offset_rows(base, gen)
    if distribution == "zero-rows":
        return zero_rows(base)
    if distribution == "int8":
        if base.dim() == 0:
            return base
        # a float32 scale, as a dequantizing kernel holds it: q * scale is then exact in float64
        scale = (base.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-30).float().double()
        return torch.round(base / scale).clamp(-127, 127) * scale
    if distribution == "outliers":
        return _with_outliers(base, gen, dtype_name)
    if distribution == "normal":
        return base
    if distribution == "large":
        return base * 100.0
    if distribution == "tiny":
        return base * 1e-3
    if distribution == "negative":
        return -base.abs() - 0.01
    if distribution == "uniform":
        return torch.rand(shape, generator=gen, dtype=torch.float64, device=device) * 2 - 1
    raise ValueError(f"unknown distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")


def _offset_rows(base: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Each row (along the last dim; a 0-d or 1-d tensor is one row) shifted by one offset of
    magnitude 10^u, u uniform in OFFSET_LOG10, of a random sign ("offset")."""
    if base.numel() == 0:
        return base
    rows = base.reshape(-1, base.shape[-1]) if base.dim() else base.reshape(1, 1)
    u = torch.rand(rows.shape[0], 2, generator=gen, dtype=torch.float64, device=base.device)
    lo, hi = OFFSET_LOG10
    shift = torch.pow(10.0, lo + u[:, :1] * (hi - lo)) * torch.where(u[:, 1:] < 0.5, -1.0, 1.0)
    return (rows + shift).view(base.shape)


def zero_rows(base: torch.Tensor, every: int = ZERO_ROWS_EVERY) -> torch.Tensor:
    """Rows 1, 1 + every, ... (along the last dim) exactly zero ("zero-rows"); a tensor of one row
    (a weight, a bias) keeps its values: zero parameters are not the point."""
    if base.dim() < 2 or base.numel() == 0:
        return base
    base = base.clone()
    base.view(-1, base.shape[-1])[1::every] = 0.0
    return base


def with_specials(base: torch.Tensor, u: torch.Tensor, *, nan: bool = True) -> torch.Tensor:
    """`base` with SPECIAL_FRACTION of its elements each NaN (unless `nan` is False), +Inf and
    -Inf, where the uniform draws `u` fall in [0, f), [f, 2f) and [2f, 3f)."""
    f = SPECIAL_FRACTION
    base = torch.where(u < f, float("nan") if nan else base, base)
    base = torch.where((u >= f) & (u < 2 * f), float("inf"), base)
    return torch.where((u >= 2 * f) & (u < 3 * f), float("-inf"), base)


# "masked": the share of rows -inf throughout, and of rows -inf at both ends (at least one of
# each where the tensor has the rows and the row the width for it: MASKED_WHOLE_FROM, MASKED_BOTH_FROM)
MASKED_WHOLE_SHARE = 1 / 8
MASKED_BOTH_SHARE = 1 / 8
MASKED_WHOLE_FROM = (2, 2)  # (rows, width): a lone row all -inf would leave nothing finite to check
# ... and only in this share of masked tensors: a loss reduced to a mean is NaN wherever a whole row
# is, so the rest keep checking partly masked rows through such a loss
MASKED_WHOLE_DRAWS = 0.5
MASKED_BOTH_FROM = (3, 3)  # a run at each end and a finite element between; a row or more of one run left
# rows with a run inside, finite elements on both sides (constrained decoding's allowed ids around a
# banned range, a sliding window's middle): a share of the rows, at least one from 2 rows of 4
MASKED_INSIDE_SHARE = 1 / 4
MASKED_INSIDE_FROM = (2, 4)


def _masked(base: torch.Tensor, gen: torch.Generator, fill: float = float("-inf")) -> torch.Tensor:
    """Each row (along the last dim) with -inf over a run at its start or its end of a uniform
    length in [0, width - 1] (the mask of a padded or causal attention row), except for a share
    of rows -inf throughout (MASKED_WHOLE_SHARE: a padded query row, whose softmax is NaN; in half
    the tensors, MASKED_WHOLE_DRAWS) and a
    share with a run at each end, at least one finite element left between (MASKED_BOTH_SHARE:
    left padding and a causal mask together; of 2 to width - 1 elements in all, split between the
    ends at random). Which rows are which comes from the generator; where none of a kind was drawn
    the row with the lowest draw becomes one (a whole row from 2 rows of 2 elements, a row masked
    at both ends from 3 rows of 3), and never is every row -inf throughout. A share of the other
    rows (MASKED_INSIDE_SHARE) has its run inside instead, of a uniform length in [1, width - 2],
    finite elements on both sides (a banned id range in constrained decoding). `fill`: the mask
    value (-inf, or the dtype's most negative finite value for "mask-min")."""
    if base.dim() == 0 or base.numel() == 0:
        return base
    width = base.shape[-1]
    rows = base.reshape(-1, width)
    n = rows.shape[0]
    u = torch.rand(n, 3, generator=gen, dtype=torch.float64, device=base.device)
    index = torch.arange(width, device=base.device, dtype=torch.float64).unsqueeze(0)
    # one run at the start or the end, shorter than the row
    length = (u[:, :1] * width).floor().clamp_max(width - 1)
    at_end = u[:, 1:2] < 0.5
    mask = torch.where(at_end, index >= width - length, index < length)
    kind = u[:, 2]
    whole = torch.zeros(n, dtype=torch.bool, device=base.device)
    # a finite mask keeps a whole row finite (uniform under a softmax): whole rows in every such draw
    share = MASKED_WHOLE_DRAWS if math.isinf(fill) else 1.0
    with_whole = float(torch.rand(1, generator=gen, dtype=torch.float64, device=base.device)) < share
    if with_whole and n >= MASKED_WHOLE_FROM[0] and width >= MASKED_WHOLE_FROM[1]:
        whole = kind < MASKED_WHOLE_SHARE
        if not bool(whole.any()):
            whole[int(kind.argmin())] = True
        if bool(whole.all()):  # some row left with finite values
            whole[int(kind.argmax())] = False
    if n >= MASKED_BOTH_FROM[0] and width >= MASKED_BOTH_FROM[1]:
        both = ~whole & (kind >= MASKED_WHOLE_SHARE) & (kind < MASKED_WHOLE_SHARE + MASKED_BOTH_SHARE)
        if not bool(both.any()):
            both[int(torch.where(whole, float("inf"), kind).argmin())] = True
        # 2 to width - 1 elements masked in all, 1 or more at each end
        total = 2 + (u[:, :1] * (width - 2)).floor().clamp_max(width - 3)
        left = 1 + (u[:, 1:2] * (total - 1)).floor().clamp_max(total - 2)
        ends = (index < left) | (index >= width - (total - left))
        mask = torch.where(both.unsqueeze(1), ends, mask)
    else:
        both = torch.zeros_like(whole)
    if n >= MASKED_INSIDE_FROM[0] and width >= MASKED_INSIDE_FROM[1]:
        free = ~whole & ~both
        share = (kind >= 1 - MASKED_INSIDE_SHARE) & free
        if not bool(share.any()) and bool(free.any()):
            share[int(torch.where(free, kind, float("-inf")).argmax())] = True
        # a run of 1 to width - 2 elements starting at 1 to width - 1 - length: finite on both sides
        v = torch.rand(n, 2, generator=gen, dtype=torch.float64, device=base.device)
        length = 1 + (v[:, :1] * (width - 2)).floor().clamp_max(width - 3)
        start = 1 + (v[:, 1:] * (width - 1 - length)).floor().clamp_max(width - 2 - length)
        inside = (index >= start) & (index < start + length)
        mask = torch.where(share.unsqueeze(1), inside, mask)
    mask = mask | whole.unsqueeze(1)
    return rows.masked_fill(mask, fill).view(base.shape)


REPEATED_CHANGES = 3  # "repeated": at most this many elements of a row drawn anew (at least one)
REPEATED_KEEP_ENDS = 16  # ... never within this many of either end of a row wider than REPEATED_WIDE
REPEATED_WIDE = 40


def _repeated(base: torch.Tensor, gen: torch.Generator, dtype_name: str) -> torch.Tensor:
    """Near-duplicate rows (along the last dim): the first row as drawn, each later row the one
    before it with 1 to REPEATED_CHANGES elements (the count uniform, at distinct places) given the
    new normal values `base` holds there, none within REPEATED_KEEP_ENDS of either end of a row
    wider than REPEATED_WIDE (anywhere in a narrower one). A new value equal to the one it replaces
    in the working dtype is moved by 1, so each row differs from the one before it in as many
    elements as were drawn; every odd row then holds, in the middle of the row, a value 1 + log(width)
    above the tensor's largest (its new max, outweighing the rest of its row). A kernel that keys a cache of a row's statistics on a few of its
    elements (its ends) meets rows that share them with the row before and differ within.
    Works in place on `base`; besides it, one int64 index per element at a time (full-size cases
    draw this class on the GPU)."""
    if base.dim() == 0 or base.numel() == 0 or base.numel() == base.shape[-1]:
        return base  # one row (or none): nothing to repeat
    width = base.shape[-1]
    rows = base.reshape(-1, width)
    n, device = rows.shape[0], base.device
    lo, hi = (REPEATED_KEEP_ENDS, width - REPEATED_KEEP_ENDS) if width > REPEATED_WIDE else (0, width)
    span = hi - lo
    most = min(REPEATED_CHANGES, span)
    u = torch.rand(n - 1, 1 + most, generator=gen, dtype=torch.float64, device=device)  # rows 1..n-1
    count = 1 + (u[:, 0] * most).floor().clamp_max(most - 1).long()
    # distinct places: the j-th of [0, span - j), stepped past the row's earlier places in ascending order
    places: list[torch.Tensor] = []
    for j in range(most):
        p = (u[:, 1 + j] * (span - j)).floor().clamp_max(span - j - 1).long()
        if places:
            for q in torch.stack(places, 1).sort(1).values.unbind(1):
                p = p + (p >= q).long()
        places.append(p)
    drawn = torch.arange(most, device=device).unsqueeze(0) < count.unsqueeze(1)
    r = torch.arange(1, n, device=device).unsqueeze(1).expand(-1, most)[drawn]
    c = (lo + torch.stack(places, 1))[drawn]
    del u, count, places, drawn
    # the changes column by column, in row order: each replaces the previous one in its column (or row 0's)
    order = (c * n + r).argsort()
    r, c = r[order], c[order]
    prev = torch.zeros_like(r)
    prev[1:] = torch.where(c[1:] == c[:-1], r[:-1], 0)
    working = TORCH_DTYPES.get(dtype_name, torch.float64)
    working = working if working.is_floating_point else torch.float64
    for _ in range(4):
        same = rows[r, c].to(working) == rows[prev, c].to(working)
        if not bool(same.any()):
            break
        rows[r[same], c[same]] += 1.0
    # each element's source row (the last change in its column up to its row), as a running sum
    source = torch.zeros(n, width, dtype=torch.long, device=device)
    source[r, c] = r - prev
    source = source.cumsum_(0)
    rows = rows.gather(0, source)
    # every other row holds one element above all the others by 1 + log(width) (a token a mask lets
    # through): its exponential outweighs the rest of the row, so a row's max and sum differ from its
    # neighbour's by a clear margin in every dtype and at any width, where a few new normal values
    # move a wide row's sum below a 16-bit tolerance
    rows[1::2, lo + span // 2] = float(rows.abs().max()) + 1.0 + math.log(width)
    return rows.view(base.shape)


def _with_outliers(base: torch.Tensor, gen: torch.Generator, dtype_name: str) -> torch.Tensor:
    """Normal values with OUTLIER_FRACTION of them (at least one) scaled to 1e3-1e4 in magnitude
    (1e2-1e3 in float16, whose products and sums of squares would overflow otherwise)."""
    if base.numel() == 0:
        return base
    flat = base.reshape(-1).clone()
    count = max(1, int(flat.numel() * OUTLIER_FRACTION))
    where = torch.randint(0, flat.numel(), (count,), generator=gen, device=flat.device)
    low = 2.0 if dtype_name == "float16" else 3.0
    scale = torch.pow(10.0, low + torch.rand(count, generator=gen, dtype=torch.float64, device=flat.device))
    sign = torch.where(flat[where] < 0, -1.0, 1.0).to(torch.float64)
    flat[where] = sign * scale
    return flat.view(base.shape)


# Integers in a declared range [lo, hi) are uniform but for their ends: a vocabulary's last token is
# every document's last target (GPT-2's end-of-text is C - 1), and a kernel that splits a row into
# whole vectors and a tail can miss a target in the tail alone; uniform targets land there with
# probability tail / C (held-out attacks-v11's cross-entropy: 0.03 tail targets a verification).
RANGE_END_FRACTION = 1 / 16  # of the elements each: exactly hi - 1; within the top RANGE_TOP_WINDOW; exactly lo
RANGE_TOP_WINDOW = 64


def ranged_integers(lo: int, hi: int, shape, gen: torch.Generator) -> torch.Tensor:
    """int64 values in [lo, hi): uniform, with RANGE_END_FRACTION of them each at hi - 1, in the
    top RANGE_TOP_WINDOW values and at lo, and the first element at hi - 1, so every case with an
    index meets the range's last value (a few-row case too)."""
    tensor = torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64, device=gen.device)
    flat = tensor.view(-1)
    if flat.numel() == 0 or hi - lo < 2:
        return tensor
    u = torch.rand(flat.shape, generator=gen, device=gen.device)
    window = torch.randint(0, min(RANGE_TOP_WINDOW, hi - lo), flat.shape, generator=gen, device=gen.device)
    flat.copy_(torch.where(u < RANGE_END_FRACTION, hi - 1, flat))
    flat.copy_(torch.where((u >= RANGE_END_FRACTION) & (u < 2 * RANGE_END_FRACTION), hi - 1 - window, flat))
    flat.copy_(torch.where((u >= 2 * RANGE_END_FRACTION) & (u < 3 * RANGE_END_FRACTION), lo, flat))
    flat[0] = hi - 1
    return tensor


def make_tensor(ttype: TensorType, dims: dict[str, int], dtype: str, *, distribution: str,
                gen: torch.Generator, device: str | torch.device = "cpu") -> torch.Tensor:
    shape = ttype.shape(dims)
    name = ttype.dtype_for(dtype)
    if ttype.value_range is not None:
        lo, hi = (d.resolve(dims) for d in ttype.value_range)
        hi = max(hi, lo + 1)
        tensor = ranged_integers(lo, hi, shape, gen)
    elif name == "bool":
        tensor = torch.rand(shape, generator=gen, device=gen.device) < 0.5
    elif name in ("int64", "int32", "int16", "int8", "uint8"):
        tensor = torch.randint(0, 100, shape, generator=gen, dtype=torch.int64, device=gen.device)
    else:
        tensor = _values(shape, distribution, gen, name)
    return tensor.to(device=device, dtype=TORCH_DTYPES[name])


IDENTITY_ROWS_EVERY = 4  # "identity": a table's first row and every fourth after it hold the constant


def identity_inputs(sig: Signature) -> list[str]:
    """The inputs the "identity" class sets to constants: floating tensors of lower rank than the
    signature's largest input (weights, biases, tables), in signature order."""
    floating = [p for p in sig.inputs if p.is_tensor and p.type.is_floating]
    top = max((len(p.type.dims) for p in floating), default=0)
    return [p.name for p in floating if len(p.type.dims) < top]


def identity_constant(index: int, seed: int) -> float:
    """The constant the `index`-th of identity_inputs holds in the case drawn with `seed`: bit
    `index` of the seed, so seeds 0 .. 2^k - 1 give every combination of ones and zeros (a weight
    of ones beside a bias of zeros, a cos row of ones beside a sin row of zeros)."""
    return float((seed >> index) & 1)


def _with_identity(tensor: torch.Tensor, constant: float) -> torch.Tensor:
    if tensor.dim() <= 1:
        return torch.full_like(tensor, constant)
    tensor = tensor.clone()
    tensor[::IDENTITY_ROWS_EVERY] = constant
    return tensor


def make_inputs(sig: Signature, dims: dict[str, int], dtype: str, *, seed: int = 0, distribution: str = "normal",
                device: str | torch.device = "cpu", scalars: dict | None = None,
                draw_on: str | torch.device = "cpu", overrides: dict | None = None) -> dict[str, object]:
    """Arguments by name, in signature order: tensors for tensor params, values for scalars.
    `draw_on`: where the random values are drawn (the GPU for full-size cases; the same seed
    gives other values there than on the CPU). `overrides`: {input: distribution} for inputs drawn
    otherwise (normal values, or infinities for specials, where the reference refuses the
    class on that input: verify/domain.py)."""
    gen = torch.Generator(device=draw_on).manual_seed(seed)
    args: dict[str, object] = {}
    constants = identity_inputs(sig)
    for param in sig.params:
        if param.is_tensor:
            drawn = (overrides or {}).get(param.name, distribution)
            args[param.name] = make_tensor(param.type, dims, dtype, gen=gen, device=device, distribution=drawn)
            if drawn == "identity" and param.name in constants:
                args[param.name] = _with_identity(args[param.name], identity_constant(constants.index(param.name), seed))
        else:
            args[param.name] = (scalars or {}).get(param.name, default_scalar(param))
    return args


def expected_outputs(sig: Signature, dims: dict[str, int], dtype: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of each output. In float64 (the verifier's truth) floating outputs are all float64."""
    def out_dtype(t: TensorType) -> torch.dtype:
        if dtype == "float64" and t.is_floating:
            return torch.float64
        return TORCH_DTYPES[t.dtype_for(dtype)]
    return [(o.type.shape(dims), out_dtype(o.type)) for o in sig.outputs]


def as_tuple(result) -> tuple:
    if isinstance(result, (tuple, list)):
        return tuple(result)
    return (result,)


def output_problems(sig: Signature, outputs: Iterable, dims: dict[str, int], dtype: str) -> list[str]:
    """How the outputs differ from what the signature promises (count, type, shape, dtype)."""
    outputs = list(outputs)
    expected = expected_outputs(sig, dims, dtype)
    if len(outputs) != len(expected):
        return [f"returned {len(outputs)} output(s), the signature declares {len(expected)}"]
    problems = []
    for out, (shape, tdtype), decl in zip(outputs, expected, sig.outputs):
        if not isinstance(out, torch.Tensor):
            problems.append(f"output {decl.name!r} is a {type(out).__name__}, not a tensor")
            continue
        if tuple(out.shape) != shape:
            problems.append(f"output {decl.name!r} has shape {tuple(out.shape)}, the signature says "
                            f"{decl.type} = {shape} for {_dims_text(dims)}")
        if out.dtype != tdtype:
            problems.append(f"output {decl.name!r} has dtype {DTYPE_NAMES.get(out.dtype, out.dtype)}, "
                            f"the signature says {DTYPE_NAMES[tdtype]}")
    return problems


def _dims_text(dims: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items())


def upcast(args: dict[str, object]) -> dict[str, object]:
    """Floating tensors to float64: the precise reference runs on the same values."""
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in args.items()}
