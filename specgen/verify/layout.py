"""Where a call's tensors live: byte arenas (inputs, outputs, and the kernel's workspace) with
guard bytes around every tensor, laid out by the judge and described to the candidate's process
by reference.

A `TensorRef` (arena, byte offset, shape, dtype) is all that crosses to the candidate's
process; both sides turn it into a view of the same memory. Guard bytes (a pattern of random
bytes drawn for each case and tiled by address, in at least GUARD bytes before and after each
tensor and in every byte of the arena that no tensor of the case uses) are checked by the
judge after every call: a kernel that writes past its outputs or its workspace (or before
them), near or megabytes away, is caught even when the overrun lands in memory nothing else
uses, without compute-sanitizer. Past the arena's ends the address space is reserved and
unmapped (arena.py), so a write there faults. The workspace has an arena of its own because
its size is known only once the inputs and outputs are placed (the kernel's size function
sees their addresses): placing it last moves nothing that was placed before.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..inputs import DTYPE_NAMES, TORCH_DTYPES

GUARD = 512  # bytes of guard pattern before and after every tensor
ALIGN = 256  # every tensor region starts on this boundary (the data may start later: offset views)
ARENAS = ("inputs", "outputs", "workspace")  # the kernel's workspace: its own arena, placed last (stage)


def shape_bytes(shape, dtype: torch.dtype) -> int:
    """The bytes of a contiguous tensor of `shape` in `dtype`."""
    count = 1
    for size in shape:
        count *= int(size)
    return count * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class TensorRef:
    arena: str  # inputs | outputs
    offset: int  # bytes from the arena's start to element [0, ..., 0]
    shape: tuple[int, ...]
    dtype: str  # a specgen dtype name

    @property
    def nbytes(self) -> int:
        return shape_bytes(self.shape, TORCH_DTYPES[self.dtype])

    def to_json(self) -> list:
        return [self.arena, self.offset, list(self.shape), self.dtype]

    @staticmethod
    def from_json(data: list) -> "TensorRef":
        return TensorRef(data[0], int(data[1]), tuple(int(s) for s in data[2]), data[3])


def view(arena: torch.Tensor, ref: TensorRef) -> torch.Tensor:
    """The tensor `ref` describes, as a view of `arena` (a uint8 tensor)."""
    raw = arena[ref.offset:ref.offset + ref.nbytes]
    return raw.view(TORCH_DTYPES[ref.dtype]).view(ref.shape)


class Layout:
    """A bump allocator over the two arenas for one case, remembering the guard regions."""

    def __init__(self):
        self.used = {name: 0 for name in ARENAS}
        self.guards: dict[str, list[tuple[int, int]]] = {name: [] for name in ARENAS}
        self.workspace: TensorRef | None = None  # uint8 bytes handed to every call of the case
        # more workspaces of the same size: one per call when calls run at the same time
        self.spare_workspaces: list[TensorRef] = []

    def place(self, arena: str, shape: tuple[int, ...], dtype: torch.dtype, element_offset: int = 0) -> TensorRef:
        itemsize = torch.empty((), dtype=dtype).element_size()
        free = self.used[arena]
        start = -(-free // ALIGN) * ALIGN
        data = start + GUARD + element_offset * itemsize
        ref = TensorRef(arena, data, tuple(int(s) for s in shape), DTYPE_NAMES[dtype])
        end = data + ref.nbytes
        self.guards[arena] += [(free, data - free), (end, GUARD)]  # the alignment gap is guarded too
        self.used[arena] = end + GUARD
        return ref

    def needed(self, arena: str) -> int:
        return self.used[arena]


class Memory:
    """The judge's side of the two arenas: the bytes, the layout of the current case, guards."""

    def __init__(self, arenas: dict[str, torch.Tensor]):
        self.arenas = arenas
        self.layout = Layout()
        self.pattern: torch.Tensor | None = None  # the guard bytes' pattern, tiled (arm_guards)

    def tensor(self, ref: TensorRef) -> torch.Tensor:
        return view(self.arenas[ref.arena], ref)

    def capacity(self, arena: str) -> int:
        return self.arenas[arena].numel() if arena in self.arenas else 0  # (no workspace arena yet)

    def unused(self, arena: str) -> tuple[int, int]:
        """The arena's bytes after the case's last tensor and its guard: (start, length)."""
        start = self.layout.used[arena]
        return start, max(self.capacity(arena) - start, 0)

    def arm_guards(self, small: bool = False) -> None:
        """Fill every guard region with a pattern drawn anew for each case (256 random bytes,
        tiled by address): a kernel cannot recognise the verifier by a fixed byte around its
        outputs, nor by uniform memory. Uniform bytes read as floats are often huge (or NaN), which
        a read past a tensor turns into a wrong result; `small`: each byte from GUARD_BYTES, so every
        float read there is small and a stray read-modify-write (`grad[row * C + target] -= 1 / N`
        at an unchecked index) changes its bytes, where a huge guard float absorbed the change and
        the write passed in about a third of the runs (session 37)."""
        device = next(iter(self.arenas.values())).device if self.arenas else "cpu"
        low, high = GUARD_BYTES if small else (0, 256)
        pattern = torch.randint(low, high, (PATTERN,), dtype=torch.uint8, device=device)
        regions = [(arena, *region) for arena, found in self.layout.guards.items()
                   for region in found + [self.unused(arena)]]
        longest = min(CHUNK, max((length for _, _, length in regions), default=0))
        # tiled once per case, one pattern longer than any piece compared at once: every
        # expected() is a view of it, so the checks after each call allocate nothing
        self.pattern = pattern.repeat(-(-longest // PATTERN) + 1)
        for arena, start, length in regions:
            for at, size in _chunks(start, length):
                self.arenas[arena][at:at + size].copy_(self.expected(at, size))

    def expected(self, start: int, length: int) -> torch.Tensor:
        """The guard pattern's bytes at arena offsets [start, start + length) (length <= CHUNK)."""
        phase = start % PATTERN
        return self.pattern[phase:phase + length]

    def _changed(self, arena: str, start: int, length: int) -> int | None:
        """The offset of the first guard byte that changed in the region, or None."""
        for at, size in _chunks(start, length):
            differs = self.arenas[arena][at:at + size] != self.expected(at, size)
            if bool(differs.any()):
                return at + int(differs.nonzero()[0, 0])
        return None

    def broken_guards(self) -> list[str]:
        """Where guard bytes changed: 'before|after <tensor region> in <arena>' lines, or the
        arena's unused bytes after the last tensor (a write megabytes past an output)."""
        if self.pattern is None:  # nothing armed yet
            return []
        found = []
        for arena, regions in self.layout.guards.items():
            start, length = self.unused(arena)
            first = self._changed(arena, start, length) if length else None
            if first is not None:
                found.append(f"{arena}: the arena's unused bytes after the last tensor, first at "
                             f"{first - start} bytes past its guard")
            if not regions:
                continue
            if len(regions) >= 64:  # many tensors: one pass over all guards, then locate
                joined = torch.cat([self.arenas[arena][a:a + n] for a, n in regions])
                wanted = torch.cat([self.expected(a, n) for a, n in regions])
                if not bool((joined != wanted).any()):
                    continue
            for index, (a, n) in enumerate(regions):
                if self._changed(arena, a, n) is not None:
                    side = "before" if index % 2 == 0 else "after"
                    found.append(f"{arena}: the {GUARD} guard bytes {side} tensor #{index // 2}")
        return found


PATTERN = 256  # bytes of the guard pattern, tiled over every guard region
# each guard byte in [0x20, 0x30): a float's top byte there is a small exponent (float32 and
# bfloat16 from 2^-63 to 2^-31, float16 from 2^-7 to 2^-3, float64 tinier): any word read as a float
# is small, so adding or subtracting a gradient's size changes it (bfloat16 near 1 would round a
# change of 1e-3 away)
GUARD_BYTES = (0x20, 0x30)
CHUNK = 64 << 20  # guard bytes filled or compared at once (the pattern tiled in memory)


def _chunks(start: int, length: int):
    for at in range(start, start + length, CHUNK):
        yield at, min(CHUNK, start + length - at)
