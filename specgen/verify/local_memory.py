"""(verifier version 13) Local memory the driver reserves for the context's life.

A kernel's local memory (a per-thread array indexed at run time, register spills) lives in the
per-thread stack. At a launch that needs more than the context's stack-size limit
(CU_LIMIT_STACK_SIZE, 1 KiB by default) the driver raises the limit and reserves that much for
every thread the device can hold at once (the limit x threads per SM x SMs), and keeps it for the
life of the process: 16 KiB per thread on an H100/H200 (2048 threads on each of 132 SMs) is 4.4 GB
of device memory PyTorch never sees (held-out attacks-v10). The candidate's process reads the limit
once its CUDA context is made (the baseline) and after every request; a limit above both the
baseline and STACK_BYTES_LIMIT is `leaked-memory` (isolation.local_memory_failure).
"""
from __future__ import annotations

import ctypes

CU_LIMIT_STACK_SIZE = 0
STACK_BYTES_LIMIT = 4096  # per thread: a few KiB of local arrays or spills is ordinary code
THREADS_PER_SM_FALLBACK = 2048  # where torch does not say (H100, H200: 2048)


def stack_limit() -> int | None:
    """The current CUDA context's per-thread stack size in bytes (cuCtxGetLimit); None where the
    driver does not answer (no driver, no current context)."""
    from .arena import driver

    try:
        value = ctypes.c_size_t()
        code = driver().cuCtxGetLimit(ctypes.byref(value), ctypes.c_int(CU_LIMIT_STACK_SIZE))
    except Exception:  # noqa: BLE001 - no driver here (CPU stand-ins)
        return None
    return int(value.value) if code == 0 else None


def resident_threads(torch, device: int) -> int | None:
    """The threads `device` holds at once: threads per SM x SMs; None where torch cannot say."""
    try:
        props = torch.cuda.get_device_properties(device)
    except Exception:  # noqa: BLE001 - no GPU
        return None
    per_sm = getattr(props, "max_threads_per_multi_processor", None) or THREADS_PER_SM_FALLBACK
    return int(per_sm) * int(props.multi_processor_count)


def stack_report(limit: int | None, last: int | None, baseline: int | None, threads: int | None,
                 op: str) -> dict | None:
    """The candidate's process's report of the stack-size limit after a request that grew it above
    `last` (the size it last reported, the baseline at first): {"stack_bytes", "baseline",
    "reserved_bytes", "op"}, whatever the size (the judge alone applies STACK_BYTES_LIMIT and the
    baseline: isolation.local_memory_failure); None where it did not grow or was not read."""
    if limit is None or (last is not None and limit <= last):
        return None
    return {"stack_bytes": limit, "baseline": baseline, "reserved_bytes": limit * threads if threads else None,
            "op": op}
