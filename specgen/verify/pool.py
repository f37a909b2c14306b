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
    from .arena import driver

    try:
        value = ctypes.c_uint64()
        code = driver().cuMemPoolGetAttribute(default_pool(device), ctypes.c_int(CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
                                              ctypes.byref(value))
    except Exception:  # noqa: BLE001 - no driver here (CPU stand-ins)
        return None
    return int(value.value) if code == 0 else None


def keep_freed_memory(device: int) -> None:
    """Set the default pool of CUDA device `device` (an ordinal) to keep all freed memory."""
    from .arena import _check, driver

    drv = driver()
    pool = default_pool(device)
    keep = ctypes.c_uint64(KEEP_EVERYTHING)
    _check(drv.cuMemPoolSetAttribute(pool, ctypes.c_int(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), ctypes.byref(keep)),
           "cuMemPoolSetAttribute(RELEASE_THRESHOLD)")
