"""The device's default memory pool keeps what kernels free, as the package's binding has it.

A kernel locked before the ABI had a workspace (docs/ARCHITECTURE.md "Workspaces") takes its
per-call scratch with cudaMallocAsync / cudaFreeAsync on `stream` from the device's default pool;
such kernels are still verified and shipped. With the pool's release threshold at 0 (CUDA's default), the
pool hands freed memory back at every synchronization and the next call maps it again (on the
H200 a two-block reduction at a decode size: 105 us that way, 9.4 us with the memory kept).
PyTorch's caching allocator never hands memory back either; the candidate's process keeps the
pool's memory the same way, so a kernel is verified and timed as it runs in a package (the
package's binding, templates/package/torch-ext/torch_binding.cpp.j2, does the same on the first
call on each device).
"""
from __future__ import annotations

import ctypes

CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7
CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8
KEEP_EVERYTHING = (1 << 64) - 1


def default_pool(device: int) -> ctypes.c_void_p:
    """The default memory pool of CUDA device `device` (an ordinal)."""
    from .arena import _check, driver

    drv = driver()
    handle = ctypes.c_int()
    _check(drv.cuDeviceGet(ctypes.byref(handle), ctypes.c_int(device)), "cuDeviceGet")
    pool = ctypes.c_void_p()
    _check(drv.cuDeviceGetDefaultMemPool(ctypes.byref(pool), handle), "cuDeviceGetDefaultMemPool")
    return pool


def used_bytes(device: int) -> int | None:
    """Bytes of the default pool of `device` allocated and not yet freed (cudaMallocAsync without its
    cudaFreeAsync, once the device is idle); None where the driver does not answer. The verifier's
    leak check (candidate_main: leaked-memory, version 12) compares it before and after a request."""
    return _pool_attribute(device, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)


def _pool_attribute(device: int, attribute: int) -> int | None:
    """A 64-bit attribute of the default pool of `device`; None where the driver does not answer."""
    from .arena import driver

    try:
        value = ctypes.c_uint64()
        code = driver().cuMemPoolGetAttribute(default_pool(device), ctypes.c_int(attribute), ctypes.byref(value))
    except Exception:  # noqa: BLE001 - no driver here (CPU stand-ins)
        return None
    return int(value.value) if code == 0 else None


# (verifier version 13) Scratch parked in the pool. With the pool keeping everything freed (as the
# package's binding sets it), what a call takes with cudaMallocAsync and frees stays reserved in the
# pool for the process's life, where PyTorch's caching allocator can never use it: a call that stages
# a float32 copy of a whole gradient there (held-out attacks-v10: 512 MiB at 16384x8192) leaves the
# model half a GiB less. The pool's high-water mark of bytes in use is reset before every request the
# leak check measures (candidate_main.LEAK_CHECKED) and read after; a peak more than
# PARKED_BYTES_LIMIT above the bytes in use before is `leaked-memory` (isolation.parked_memory_failure).
# Small scratch (one float per row, as the honest kernels of tests/kernels take) stays far below it.
PARKED_BYTES_LIMIT = 64 << 20


def reset_peak(device: int) -> bool:
    """Reset the default pool's high-water mark of bytes in use to the bytes in use now (setting
    cudaMemPoolAttrUsedMemHigh to 0 does that); False where the driver does not answer."""
    from .arena import driver

    try:
        zero = ctypes.c_uint64(0)
        code = driver().cuMemPoolSetAttribute(default_pool(device), ctypes.c_int(CU_MEMPOOL_ATTR_USED_MEM_HIGH),
                                              ctypes.byref(zero))
    except Exception:  # noqa: BLE001 - no driver here (CPU stand-ins)
        return False
    return code == 0


def peak_bytes(device: int) -> int | None:
    """The default pool's high-water mark of bytes in use on `device` since reset_peak (or since the
    process began); None where the driver does not answer."""
    return _pool_attribute(device, CU_MEMPOOL_ATTR_USED_MEM_HIGH)


def parked_report(before: int | None, peak: int | None, op: str) -> dict | None:
    """The candidate's process's report of scratch parked in the pool by a request: {"bytes", "op"}
    when the pool's peak since the request began is above the bytes in use before it, whatever the
    amount (the judge alone applies PARKED_BYTES_LIMIT: isolation.parked_memory_failure); None where
    nothing was parked or either was not read."""
    if before is None or peak is None or peak <= before:
        return None
    return {"bytes": peak - before, "op": op}


def keep_freed_memory(device: int) -> None:
    """Set the default pool of CUDA device `device` (an ordinal) to keep all freed memory."""
    from .arena import _check, driver

    drv = driver()
    pool = default_pool(device)
    keep = ctypes.c_uint64(KEEP_EVERYTHING)
    _check(drv.cuMemPoolSetAttribute(pool, ctypes.c_int(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), ctypes.byref(keep)),
           "cuMemPoolSetAttribute(RELEASE_THRESHOLD)")


# ------------------------------------------------------------------ a pool that cannot grow
# (verifier version 12) A kernel that takes scratch with cudaMallocAsync must check the answer: on a
# nearly full GPU (training tuned to the memory limit) the allocation fails, and a kernel that
# launches with the null pointer kills the CUDA context (an illegal address) where torch would raise
# a catchable OutOfMemoryError (held-out attacks-v9's bias_gelu backward, session 34). The verifier's
# GPU always has room, so the candidate's process makes one call with the device's current pool
# swapped for a pool capped at STARVED_POOL_BYTES and already full (cudaMallocAsync allocates from
# the device's current pool: cuDeviceSetMemPool), then puts the default pool back.

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
STARVED_POOL_BYTES = 2 << 20  # the cap asked for: one allocation granule of device memory
# The driver may round the cap up to its own granule (driver 580 on the H200: 8 allocations of 2 MiB
# did not fill it, session 38), so the pool is filled until an allocation of 256 bytes fails, with
# sizes that double while allocations succeed and halve when one fails. A driver that does not honour
# the cap at all is met at STARVED_FILL_LIMIT: the check is then named as not run.
STARVED_FILL_LIMIT = 1 << 30
SMALLEST_ALLOCATION = 256


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _PoolProps(ctypes.Structure):  # CUmemPoolProps (cuda.h, CUDA 12.2+: maxSize and usage)
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", _Location),
                ("win32SecurityAttributes", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]


class StarvedPool:
    """`with StarvedPool(device) as starved:` the device's current memory pool is a full pool that
    cannot grow, so every cudaMallocAsync on the device fails (cudaErrorMemoryAllocation); the
    default pool is put back after. `starved.problem` says why it could not be set up (the check is
    then skipped, never failed)."""

    def __init__(self, device: int):
        self.device = device
        self.problem: str | None = None
        self.pool = ctypes.c_void_p()
        self.fills: list[ctypes.c_uint64] = []
        self.filled = 0  # bytes allocated to fill the pool: what the driver's cap really was
        self.handle = ctypes.c_int()
        self.swapped = False

    def __enter__(self) -> "StarvedPool":
        try:
            self._set_up()
        except Exception as error:  # noqa: BLE001 - an older driver: the check is skipped
            self.problem = f"the capped pool could not be set up: {error}"
            self.__exit__()
        return self

    def _set_up(self) -> None:
        from .arena import _check, driver

        drv = driver()
        _check(drv.cuDeviceGet(ctypes.byref(self.handle), ctypes.c_int(self.device)), "cuDeviceGet")
        props = _PoolProps(allocType=CU_MEM_ALLOCATION_TYPE_PINNED,
                           location=_Location(CU_MEM_LOCATION_TYPE_DEVICE, self.device), maxSize=STARVED_POOL_BYTES)
        _check(drv.cuMemPoolCreate(ctypes.byref(self.pool), ctypes.byref(props)), "cuMemPoolCreate")
        self._fill(drv)
        _check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
        _check(drv.cuDeviceSetMemPool(self.handle, self.pool), "cuDeviceSetMemPool")
        self.swapped = True

    def _fill(self, drv) -> None:
        """Allocate from the capped pool until the smallest allocation fails (see STARVED_FILL_LIMIT)."""
        size = STARVED_POOL_BYTES
        while size >= SMALLEST_ALLOCATION:
            ptr = ctypes.c_uint64()
            if drv.cuMemAllocFromPoolAsync(ctypes.byref(ptr), ctypes.c_size_t(size), self.pool,
                                           ctypes.c_void_p(0)) != 0:
                size //= 2
                continue
            self.fills.append(ptr)
            self.filled += size
            if self.filled > STARVED_FILL_LIMIT:
                raise RuntimeError(f"a pool capped at {STARVED_POOL_BYTES} bytes still grew past "
                                   f"{STARVED_FILL_LIMIT} bytes")
            if self.filled >= 4 * size:
                size *= 2

    def __exit__(self, *exc) -> None:
        from .arena import driver

        try:
            drv = driver()
            if self.swapped:
                drv.cuDeviceSetMemPool(self.handle, default_pool(self.device))
            for ptr in self.fills:
                drv.cuMemFreeAsync(ptr, ctypes.c_void_p(0))
            drv.cuCtxSynchronize()
            if self.pool.value:
                drv.cuMemPoolDestroy(self.pool)
        except Exception:  # noqa: BLE001 - a lost context: the call's own verdict says so
            pass
        self.swapped, self.fills = False, []
