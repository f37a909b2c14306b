"""An arena that spans tens of GiB of address space but holds memory only where tensors sit.

Why: every other case lays its tensors out in one compact arena (layout.py), so two inputs of a
call are never more than a few hundred MB apart, and a kernel that reaches one input through
another's pointer with a 32-bit element offset is never caught (held-out attacks-v11's
add_rmsnorm_a). In a model the caching allocator puts a call's tensors wherever it has room,
often many GiB apart. far_inputs.py places tensors 9 to 17 GiB apart in a SparseArena: one
reservation of virtual address space (cuMemAddressReserve) with a physical allocation mapped
(cuMemCreate/cuMemMap) only at each piece a tensor needs. Between the pieces nothing is mapped:
a wrapped offset that lands there faults (`crash`), one that lands on another tensor reads the
wrong values (`wrong-result`).

As with arena.py, the judge creates the pieces and exports each as a file descriptor; the
candidate's process reserves a range of the same span and maps the pieces at the same offsets
(inputs read-only), so both see one memory. The channel carries at most 8 descriptors a message,
so the pieces go over in batches (`far_messages`, `serve_far_arenas`).

`HostSparseArena` is the CPU stand-ins' version (the unit tests): an anonymous mapping of the
whole span with MAP_NORESERVE, whose untouched pages cost nothing; `host_bytes_at` lets a
stand-in read what a GPU would find at an address (None where a GPU would fault).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import weakref

from .arena import (CU_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    CU_MEM_LOCATION_TYPE_DEVICE, MARGIN, ArenaError, _AccessDesc, _check, _CudaArray, _Location, _prop,
                    driver)

MAX_FDS = 8  # descriptors per channel message (channel.Channel.receive reads at most 8)


class SparseArena:
    """`span` bytes of reserved device address space (and MARGIN unmapped on each side) with
    physical memory mapped only at `pieces`: [(offset, length)], granularity-aligned."""

    def __init__(self, span: int, device: int, readonly: bool):
        drv = driver()
        self.span, self.device, self.readonly = span, device, readonly
        self.pieces: list[tuple[int, int, int]] = []  # (offset, length, handle), mapped
        self.fds: list[int] = []  # the exporter's descriptors, one per piece
        base = ctypes.c_ulonglong()
        _check(drv.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(span + 2 * MARGIN), ctypes.c_size_t(0),
                                       ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)),
               f"cuMemAddressReserve({span + 2 * MARGIN} bytes)")
        self.base = base.value
        self.pointer = base.value + MARGIN

    @classmethod
    def create(cls, span: int, pieces: list[tuple[int, int]], device: int = 0, export: bool = True) -> "SparseArena":
        """The judge's side: a new allocation per piece, mapped read-write here, exported as fds."""
        drv = driver()
        arena = cls(span, device, readonly=False)
        try:
            for offset, length in pieces:
                handle = ctypes.c_ulonglong()
                _check(drv.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(length), ctypes.byref(_prop(device)),
                                       ctypes.c_ulonglong(0)), f"cuMemCreate({length} bytes)")
                if export:
                    fd = ctypes.c_int(-1)
                    code = drv.cuMemExportToShareableHandle(ctypes.byref(fd), handle,
                                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                            ctypes.c_ulonglong(0))
                    if code != 0:
                        drv.cuMemRelease(handle)
                        _check(code, "cuMemExportToShareableHandle")
                    arena.fds.append(fd.value)
                arena._map(handle.value, offset, length, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        except BaseException:
            arena.close()
            raise
        return arena

    def attach_piece(self, fd: int, offset: int, length: int) -> None:
        """The candidate's side: map one exported piece at `offset`, with this arena's rights."""
        drv = driver()
        handle = ctypes.c_ulonglong()
        try:
            _check(drv.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd),
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   "cuMemImportFromShareableHandle")
        finally:
            os.close(fd)
        rights = CU_MEM_ACCESS_FLAGS_PROT_READ if self.readonly else CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._map(handle.value, offset, length, rights)

    def _map(self, handle: int, offset: int, length: int, rights: int) -> None:
        drv = driver()
        if offset < 0 or offset + length > self.span:
            drv.cuMemRelease(ctypes.c_ulonglong(handle))
            raise ArenaError(f"a piece at {offset} (+{length}) lies outside the sparse arena's {self.span} bytes")
        at = ctypes.c_ulonglong(self.pointer + offset)
        code = drv.cuMemMap(at, ctypes.c_size_t(length), ctypes.c_size_t(0), ctypes.c_ulonglong(handle),
                            ctypes.c_ulonglong(0))
        if code != 0:
            drv.cuMemRelease(ctypes.c_ulonglong(handle))
            _check(code, "cuMemMap")
        self.pieces.append((offset, length, handle))
        access = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, self.device), rights)
        _check(drv.cuMemSetAccess(at, ctypes.c_size_t(length), ctypes.byref(access), ctypes.c_size_t(1)),
               "cuMemSetAccess")

    @property
    def mapped_bytes(self) -> int:
        return sum(length for _, length, _ in self.pieces)

    def tensor(self):
        """The whole span as a torch uint8 tensor on the device (no copy; only the pieces may be touched)."""
        import torch

        owner = _CudaArray(self.pointer, self.span, self)
        return torch.as_tensor(owner, device=f"cuda:{torch.cuda.current_device()}")

    def close(self) -> None:
        drv = driver()
        for offset, length, handle in self.pieces:
            drv.cuMemUnmap(ctypes.c_ulonglong(self.pointer + offset), ctypes.c_size_t(length))
            drv.cuMemRelease(ctypes.c_ulonglong(handle))
        self.pieces = []
        if self.base:
            drv.cuMemAddressFree(ctypes.c_ulonglong(self.base), ctypes.c_size_t(self.span + 2 * MARGIN))
            self.base = self.pointer = 0
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


# ------------------------------------------------------------------ the channel (IsolatedRunner)

def far_messages(name: str, arena: SparseArena, pieces: list[tuple[int, int]], readonly: bool):
    """(message, fds) pairs that make the candidate's process map `arena` as `name`: at most
    MAX_FDS pieces a message, the first one reserving the span (serve_far_arenas)."""
    batches = [list(range(at, min(at + MAX_FDS, len(pieces)))) for at in range(0, max(len(pieces), 1), MAX_FDS)]
    for number, batch in enumerate(batches):
        yield ({"op": "far_arenas", "name": name, "span": arena.span, "readonly": readonly, "first": number == 0,
                "pieces": [list(pieces[i]) for i in batch]}, tuple(arena.fds[i] for i in batch))


def serve_far_arenas(arenas: dict, message: dict, fds: list[int], device: int) -> dict:
    """The candidate's process: `arenas` (name -> (arena, tensor)) gets or drops sparse arenas.
    {"drop": [names]} unmaps them; otherwise the message's pieces are mapped into arena `name`,
    a new reservation when `first`. The reply: ok, or "refused" with why (out of memory, no VMM):
    the judge then names the check as not run; the process and its context stay as they were."""
    fds = list(fds)
    try:
        for name in message.get("drop", []):
            old = arenas.pop(name, None)
            if old is not None:
                old[0].close()
        if "name" not in message:
            return {"type": "ok"}
        name = message["name"]
        if message.get("first"):
            old = arenas.pop(name, None)
            if old is not None:
                old[0].close()
            arenas[name] = (SparseArena(int(message["span"]), device, readonly=bool(message["readonly"])), None)
        arena = arenas[name][0]
        pieces = message["pieces"]
        if len(fds) != len(pieces):
            raise ArenaError(f"{len(pieces)} pieces of arena {name} came with {len(fds)} descriptors")
        while fds:
            offset, length = pieces[len(pieces) - len(fds)]
            arena.attach_piece(fds.pop(0), int(offset), int(length))  # (it closes the descriptor)
        # the whole span as one tensor, made once its lowest piece is mapped (torch asks about the pointer)
        arenas[name] = (arena, arena.tensor() if any(offset == 0 for offset, _, _ in arena.pieces) else None)
    except ArenaError as error:
        return {"type": "refused", "message": str(error)}
    finally:
        for fd in fds:
            os.close(fd)
    return {"type": "ok"}


# ------------------------------------------------------------------ the CPU stand-ins' version

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # (Linux's value where Python does not name it)
_live_host: "weakref.WeakSet[HostSparseArena]" = weakref.WeakSet()


class HostSparseArena:
    """`span` bytes of host address space (MAP_NORESERVE: untouched pages cost nothing), of which
    only `pieces` count as mapped: what a CPU stand-in sees in place of a SparseArena."""

    def __init__(self, span: int, pieces: list[tuple[int, int]]):
        import torch

        self.span, self.pieces = span, [(int(o), int(n)) for o, n in pieces]
        try:
            self._map = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
        except (OSError, ValueError) as error:
            raise ArenaError(f"cannot reserve {span} bytes of host address space: {error}") from None
        self._tensor = torch.frombuffer(self._map, dtype=torch.uint8)
        self.pointer = self._tensor.data_ptr()
        _live_host.add(self)

    @property
    def mapped_bytes(self) -> int:
        return sum(length for _, length in self.pieces)

    def tensor(self):
        return self._tensor

    def bytes_at(self, address: int, nbytes: int):
        """The arena's bytes [address, address + nbytes) when they lie in one piece, else None."""
        start = address - self.pointer
        for offset, length in self.pieces:
            if offset <= start and start + nbytes <= offset + length:
                return self._tensor[start:start + nbytes]
        return None

    def contains(self, address: int) -> bool:
        return self.pointer <= address < self.pointer + self.span

    def close(self) -> None:
        _live_host.discard(self)
        self.pieces = []  # the mapping itself goes with the last view of it (torch holds the buffer)
        self._tensor = self._map = None


def host_bytes_at(address: int, nbytes: int):
    """For CPU stand-ins that compute an address from other pointers: the bytes a GPU would read
    there, if it lies in a piece of a live HostSparseArena; None where a GPU would fault (between
    the pieces) or the address is in no such arena."""
    for arena in list(_live_host):
        if arena.contains(address):
            return arena.bytes_at(address, nbytes)
    return None
