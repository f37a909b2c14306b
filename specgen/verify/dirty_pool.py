"""A default memory pool other users left dirty (verifier version 16).

Why: a kernel locked before the ABI's workspace takes per-call scratch with cudaMallocAsync on
`stream` from the device's default pool (pool.py). In the candidate's process nothing but the kernel
allocates from that pool (torch's caching allocator uses cudaMalloc, the arenas cuMemCreate, graphs
their own memory), so every block it is handed was freshly mapped (zero) or last held the kernel's
own bytes. A real process shares the pool: PyTorch with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
takes every tensor from it, CuPy's MemoryAsyncPool, the package's other ops that take pool scratch.
Blocks come back holding whatever their last user wrote. Held-out attacks-v11's bias_gelu_a keeps
its "last block" tickets in 4 KiB of pool scratch it never zeroes ("fresh pool memory is zero and
the kernel puts the counters back"): with another user's bytes there, grad_bias is never written,
and the counters stay wrong for every later call (passed version 15).

What: before a call, blocks of a spread of sizes (256 bytes to 8 MiB, the sizes kernels take for
counters, per-row statistics and split-row partials) are allocated from the pool on the call's
stream, every one filled with random non-zero bytes (cuMemsetD32Async, a pattern per block), then
freed: the pool keeps them (its release threshold is set to keep everything, pool.keep_freed_memory),
and the pool's reserved memory no block landed in is topped up the same way, so whatever the kernel
allocates next holds someone else's bytes. Two such calls in a row, each checked, then a call on the
pool as they left it (a counter left non-zero breaks the next call). A CPU stand-in gets the same from
CpuDevicePool (its "cudaMallocAsync"), which the stand-in runner dirties the same way.
"""
from __future__ import annotations

import ctypes
import dataclasses
import random

import torch

# The candidate's process imports this module for dirty_default_pool alone: the judge's checking code
# (checks, data, runner, verdict) is imported inside the check's functions, never there.

# Block sizes the pool is dirtied with, in bytes, each DIRTY_COPIES times.
DIRTY_SIZES = (256, 768, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 8 << 20)
DIRTY_COPIES = 2
DIRTY_LIMIT = 256 << 20  # the most one dirtying allocates (the top-up of a pool that kept much stops here)
TOP_UP_STEPS = 256  # allocations of the top-up at most
SMALLEST = 256  # the smallest block the top-up takes (cudaMallocAsync rounds smaller ones up)
CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5
CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7
DIRTY_CALLS = 2  # calls in a row, each right after the pool was dirtied; then one on the pool as they left it
SEED_OFFSET = 7200  # the dirty-pool cases' values: other draws than every other check's

HINT = ("memory from cudaMallocAsync holds whatever its last user left there: in a process where PyTorch "
        "(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync), CuPy or the package's other ops allocate from the same "
        "default pool, a block arrives with their bytes. Zero your counters and scratch with cudaMemsetAsync on "
        "`stream` before the kernels that read them (every call, not only the first), or take them from the "
        "workspace the ABI hands each call (ask for it through the size function) and zero what must start at zero")


# ------------------------------------------------------------------ on a GPU: the driver's default pool

def random_pattern(rng: random.Random) -> int:
    """A 32-bit fill whose four bytes are all non-zero (a counter, a flag or a float read from it is
    never 0)."""
    return int.from_bytes(bytes(rng.randint(1, 255) for _ in range(4)), "little")


class PoolDirtier:
    """Dirties the device's current memory pool through the driver `drv` (arena.driver(), or a fake
    in the tests): `pool` is the pool whose attributes are read (the default pool), `stream` the
    call's stream handle. `fill()` returns the bytes dirtied; every block is freed again, even
    when an allocation fails halfway."""

    def __init__(self, drv, pool, stream: int, seed: int):
        self.drv, self.pool, self.stream = drv, pool, ctypes.c_void_p(int(stream) or None)
        self.rng = random.Random(seed)
        self.blocks: list[ctypes.c_uint64] = []
        self.total = 0
        self.sizes: list[int] = []  # each block's size, in order (the tests read it)
        self.patterns: list[int] = []

    def fill(self) -> int:
        try:
            for size in DIRTY_SIZES:
                for _ in range(DIRTY_COPIES):
                    self._take(size)
            self._top_up()
        finally:
            for ptr in self.blocks:
                self.drv.cuMemFreeAsync(ptr, self.stream)
            self.blocks = []
        return self.total

    def _top_up(self) -> None:
        """The pool's reserved bytes that no block holds (memory it kept from earlier calls, the rest
        of a chunk the blocks above were carved from), taken in blocks that halve while they do not
        fit, until less than SMALLEST is left (or the limits)."""
        size = DIRTY_SIZES[-1]
        for _ in range(TOP_UP_STEPS):
            reserved, used = self._attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), \
                self._attribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
            if reserved is None or used is None or self.total >= DIRTY_LIMIT:
                return
            gap = reserved - used
            if gap < SMALLEST:
                return
            size = min(size, 1 << (gap.bit_length() - 1))
            if size < SMALLEST:
                return
            if not self._take(size) or (self._attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) or 0) > reserved:
                size //= 2  # it did not fit in what was free: the free bytes are in smaller pieces

    def _take(self, size: int) -> bool:
        ptr = ctypes.c_uint64()
        if self.drv.cuMemAllocAsync(ctypes.byref(ptr), ctypes.c_size_t(size), self.stream) != 0:
            return False
        self.blocks.append(ptr)
        pattern = random_pattern(self.rng)
        self.drv.cuMemsetD32Async(ptr, ctypes.c_uint(pattern), ctypes.c_size_t(size // 4), self.stream)
        self.total += size
        self.sizes.append(size)
        self.patterns.append(pattern)
        return True

    def _attribute(self, attribute: int) -> int | None:
        value = ctypes.c_uint64()
        if self.drv.cuMemPoolGetAttribute(self.pool, ctypes.c_int(attribute), ctypes.byref(value)) != 0:
            return None
        return int(value.value)


def dirty_default_pool(device: int, stream: int, seed: int) -> str | None:
    """The default pool of CUDA device `device` dirtied on stream handle `stream` (PoolDirtier), the
    device then idle; None when done, else why it could not be (the check is then named as not run)."""
    from .arena import driver
    from .pool import default_pool

    try:
        drv = driver()
        dirtier = PoolDirtier(drv, default_pool(device), stream, seed)
        dirtied = dirtier.fill()
        drv.cuCtxSynchronize()
    except Exception as error:  # noqa: BLE001 - an older driver: the check is skipped
        return f"the default pool could not be dirtied: {error}"
    return None if dirtied else "the default pool could not be dirtied: no block could be allocated from it"


# ------------------------------------------------------------------ on the CPU: a stand-in's pool

class CpuDevicePool:
    """A CPU stand-in's "cudaMallocAsync" (pool_of(kernel)): blocks come back as their last user left
    them, fresh ones zero, as the device's default pool behaves; `malloc` returns None while the
    runner makes every allocation fail (the kernel's `allocations_fail`, starved.py)."""

    def __init__(self, owner=None):
        import threading

        self.owner = owner
        self.free_blocks: list[torch.Tensor] = []
        self.taken: dict[int, torch.Tensor] = {}
        self.dirtied = 0  # times dirty() ran (the tests read it)
        self.lock = threading.Lock()  # calls from host threads allocate at once

    def malloc(self, nbytes: int) -> torch.Tensor | None:
        """A uint8 block of `nbytes`: the smallest free block that holds it, else a fresh zero one."""
        if getattr(self.owner, "allocations_fail", False):
            return None
        with self.lock:
            fits = [b for b in self.free_blocks if b.numel() >= nbytes]
            if fits:
                block = min(fits, key=lambda b: b.numel())
                self.free_blocks = [b for b in self.free_blocks if b is not block]
            else:
                block = torch.zeros(max(int(nbytes), 1), dtype=torch.uint8)
            self.taken[block.data_ptr()] = block
        return block[:nbytes]

    def free(self, view: torch.Tensor | None) -> None:
        if view is not None:
            with self.lock:
                self.free_blocks.append(self.taken.pop(view.data_ptr()))

    def dirty(self, seed: int) -> None:
        """What another user of the pool leaves: every free block and a spread of new ones (DIRTY_SIZES
        up to 1 MiB: a stand-in's scratch is small) filled with random non-zero bytes, all free."""
        gen = torch.Generator().manual_seed(seed)
        with self.lock:
            have = [b.numel() for b in self.free_blocks]
            for size in (s for s in DIRTY_SIZES if s <= 1 << 20):
                for _ in range(DIRTY_COPIES - have.count(size)):
                    self.free_blocks.append(torch.empty(size, dtype=torch.uint8))
            for block in self.free_blocks:
                block.copy_(torch.randint(1, 256, block.shape, generator=gen, dtype=torch.uint8))
            self.dirtied += 1


def pool_of(kernel) -> CpuDevicePool:
    """The CPU stand-in `kernel`'s default pool (one per kernel object, as one per process)."""
    pool = kernel.__dict__.get("device_pool")
    if pool is None:
        pool = kernel.__dict__["device_pool"] = CpuDevicePool(kernel)
    return pool


def dirty_before_call(lib, device: torch.device, stream, seed: int) -> str | None:
    """The pool a call in this process (LocalRunner) allocates from, dirtied: the GPU's default pool
    on `stream` (a torch stream or a handle), or a CPU stand-in's CpuDevicePool. None when done."""
    if device.type == "cuda":
        return dirty_default_pool(device.index if device.index is not None else torch.cuda.current_device(),
                                  int(getattr(stream, "cuda_stream", stream) or 0), seed)
    pool_of(lib).dirty(seed)
    return None


# ------------------------------------------------------------------ the check

def dirty_pool_cases(spec, seed: int, budget: int, smoke_stream: str = "legacy") -> list[tuple]:
    """(case, stream kind) of the check: the smoke shape on the legacy default stream (the package's
    binding's stream in a program that never makes one) and the large case (the first benchmark shape
    scaled into the budget, rows kept wide) on a stream of its own."""
    from .strategies import large_case, smoke_case

    smoke = smoke_case(spec, seed)
    big = large_case(spec, budget, seed + 1)
    cases = [(dataclasses.replace(smoke, seed=smoke.seed + SEED_OFFSET), smoke_stream)]
    if big.dim_map != smoke.dim_map:
        cases.append((dataclasses.replace(big, seed=big.seed + SEED_OFFSET), "pool"))
    return cases


def check_dirty_pool(runner, data, stream: str = "pool", seed: int = 0) -> str | None:
    """`data` (a staged data.CaseData) called DIRTY_CALLS times in a row, each right after the default
    pool was left dirty (runner.dirty_call), then once on the pool as those calls left it; every call's
    outputs checked. None when checked; else why the pool could not be dirtied (the check was not run)."""
    from .. import abi
    from .checks import check_close
    from .runner import check_guards, fill_outputs, raise_outcome, synchronize
    from .verdict import Failure

    entry = abi.entry_point(runner.spec, data.direction)
    refs = {**data.input_refs, **data.output_refs}
    for number in range(DIRTY_CALLS + 1):
        dirtied = number < DIRTY_CALLS
        fill_outputs(runner, data.output_refs, number % 2)
        synchronize(data.device)
        if dirtied:
            outcome = runner.dirty_call(data.direction, refs, data.scalars, data.dims, stream=stream,
                                        seed=seed + number)
            if outcome.skipped:
                return outcome.skipped
            what = (f"{entry} on {data.case.describe()}, call {number + 1} of {DIRTY_CALLS} in a row each made "
                    f"right after the device's default memory pool was left dirty by another user (every block "
                    f"cudaMallocAsync hands out holding random non-zero bytes)")
        else:
            outcome = runner.call(data.direction, refs, data.scalars, data.dims, stream=stream)
            what = (f"{entry} on {data.case.describe()}, a call right after {DIRTY_CALLS} calls each made on a "
                    f"default memory pool left dirty by another user (the pool as those calls left it)")
        raise_outcome(runner.spec, data, outcome, what=what)
        check_guards(runner, data, f"{what}: ")
        got = {name: runner.tensor(ref).clone() for name, ref in data.output_refs.items()}
        try:
            check_close(data, got, prefix=f"{what}: ")
        except Failure as failure:
            raise Failure(failure.reason, f"{failure.detail}. {HINT}", failure.counterexample,
                          fatal=failure.fatal) from None
    return None


def check_dirty_pool_calls(session, direction: str, smoke_stream: str = "legacy") -> int:
    """The check at dirty_pool_cases in one direction (engine.Session.small_cases); the calls made.
    A pool that could not be dirtied is named as not run."""
    from .data import stage

    made = 0
    for case, stream in dirty_pool_cases(session.spec, session.options.seed, session.options.budget, smoke_stream):
        session.progress(f"{direction}: calls on a default memory pool left dirty by another user, "
                         f"{case.describe()}")
        data = session.prepare(case, direction)
        stage(session.runner, data, snapshots=False)
        skipped = check_dirty_pool(session.runner, data, stream, seed=session.options.seed + SEED_OFFSET + made)
        del data
        if skipped is not None:
            session.not_run(f"{direction}: the calls on a default memory pool left dirty", skipped)
            return made
        made += DIRTY_CALLS + 1
    return made
