"""Indices outside their declared range (verifier version 12).

A spec's integer input may declare a range (`target: Tensor[N] int64 in [0, C)`). The package
checks it on the device without a host sync (docs/ARCHITECTURE.md "Contracts": the error is lazy,
raised by a later call), so the kernel of the bad call runs anyway, and so may the backward that
follows it: a user's padding label -100 (Hugging Face's `ignore_index`) reaches the kernel. Its
results are then invalid, but it must stay within its own memory: a write at `grad[row * C +
target]` with target -100 lands in the previous row or before the tensor, in memory of another
tensor (held-out attacks-v9's cross-entropy backward, session 34).

Here the first element of every ranged input is set below its range (-100, or one below the range
when -100 is inside it) and the last one to the range's end (one past its last value), the first
and last rows, so a write at such an index meets the guard bytes around the outputs. The call may
return an error code (it found the bad value) or any output values; it may not crash or write
outside its outputs and workspace. Reads outside an input stay unseen (the guard bytes are
readable; the sanitizer sees them).
"""
from __future__ import annotations

from .. import abi
from .data import CaseData
from .runner import check_guards, fill_outputs, raise_if_faulted, synchronize

PADDING_LABEL = -100  # the label Hugging Face's collators pad with (cross-entropy's ignore_index)


def ranged_inputs(spec, dims: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The integer inputs that declare a range, with it resolved at `dims`: name -> [lo, hi)."""
    ranges = {}
    for param in spec.signature.inputs:
        if param.is_tensor and param.type.value_range is not None:
            lo, hi = (d.resolve(dims) for d in param.type.value_range)
            ranges[param.name] = (lo, max(hi, lo + 1))
    return ranges


def out_of_range_values(lo: int, hi: int) -> tuple[int, int]:
    """The values written at an input's first and last elements: below the range, then its end."""
    below = PADDING_LABEL if PADDING_LABEL < lo else lo - 1
    return below, hi


def plant_out_of_range(data: CaseData, ranges: dict[str, tuple[int, int]]) -> list[str]:
    """The staged inputs of `data` with their first and last elements out of range (in place, in
    the arena); the words that say so, one per input."""
    planted = []
    for name, (lo, hi) in ranges.items():
        tensor = data.inputs.get(name)
        if tensor is None or tensor.numel() == 0:
            continue
        below, above = out_of_range_values(lo, hi)
        flat = tensor.view(-1)
        flat[0] = below
        if flat.numel() > 1:
            flat[-1] = above
        planted.append(f"{name}'s first element {below} and last {above} (its range [{lo}, {hi}))")
    return planted


def check_out_of_range_indices(runner, data: CaseData) -> bool:
    """`data` (staged) called with its ranged inputs' first and last elements out of range: no
    crash, no hang, no write outside the outputs and workspace. Called twice: over the guard bytes
    staging drew, then over small ones (a write at such an index is often a read-modify-write, the
    target's -1/N added in place, which a guard word reading as a huge float absorbs bit for bit:
    layout.arm_guards). False when the spec has no ranged input (nothing run)."""
    ranges = ranged_inputs(runner.spec, data.dims)
    if not ranges:
        return False
    planted = plant_out_of_range(data, ranges)
    entry = abi.entry_point(runner.spec, data.direction)
    what = (f"{entry} on {data.case.describe()} with indices outside their declared range ({'; '.join(planted)}: "
            f"a padding label such as {PADDING_LABEL} reaches the kernel before the package's lazy range check "
            f"reports it)")
    for small_guards in (False, True):
        if small_guards:
            runner.memory.arm_guards(small=True)
        fill_outputs(runner, data.output_refs, 0)
        synchronize(data.device)
        outcome = runner.call(data.direction, {**data.input_refs, **data.output_refs}, data.scalars, data.dims)
        raise_if_faulted(outcome, what, "An index outside its range may give any result, or an error code, but "
                                        "never a fault: skip or clamp it before using it as an address")
        check_guards(runner, data, f"with {what}: ")
    return True
