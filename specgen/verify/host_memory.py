"""(verifier version 13) Host memory a kernel's calls leak.

An entry point's host code runs in the caller's process: memory it allocates per call (`new`,
`malloc`) and never frees grows without bound in a server or a training run, one call per token or
step, until the host runs out of memory, and no output shows it (held-out attacks-v10: about 2 KiB
per call). The candidate's process measures its malloc heap in use around the endurance run
(candidate_main._endure: tens of thousands of host calls); the judge (engine.endurance) rejects a
growth above HOST_GROWTH_LIMIT that is also above HOST_BYTES_PER_CALL_LIMIT per host call
(`leaked-memory`).
"""
from __future__ import annotations

import ctypes
import functools

HOST_GROWTH_LIMIT = 16 << 20  # bytes over the whole run: the allocator's and the driver's own noise
# bytes per host call. Measured on the H200 (session 38), honest kernels' processes grow by 147 bytes
# a call (one launch a call) to 294 (cross-entropy's control, two launches): the harness's and the
# driver's own, linear over 40,000 calls. A leak of less than 1 KiB a call is not seen (a limit);
# held-out attacks-v10's rope leaked 2.26 KiB a call.
HOST_BYTES_PER_CALL_LIMIT = 1024
PROJECTED_CALLS = 10**7  # a long server run's calls, for the failure's projection


class _MallInfo2(ctypes.Structure):  # glibc 2.33+ struct mallinfo2: every field a size_t
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=1)
def _mallinfo2():
    """glibc's mallinfo2, or None (another libc, or glibc before 2.33)."""
    try:
        libc = ctypes.CDLL(None)
        function = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [], _MallInfo2
    return function


def _vm_rss() -> int | None:
    """The process's resident set in bytes (VmRSS of /proc/self/status); None where there is none."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def heap_in_use() -> tuple[int, str] | None:
    """(bytes, how): the malloc heap's bytes in use (mallinfo2: allocated chunks, uordblks, plus the
    mmapped ones, hblkhd; every arena, so every thread's), or the process's resident set where
    mallinfo2 is missing; None where neither can be read."""
    function = _mallinfo2()
    if function is not None:
        info = function()
        return int(info.uordblks) + int(info.hblkhd), "mallinfo2"
    rss = _vm_rss()
    return (rss, "VmRSS") if rss is not None else None


def growth_report(before: tuple[int, str] | None, after: tuple[int, str] | None, host_calls: int) -> dict | None:
    """The candidate's process's report of its heap around `host_calls` host calls: {"growth",
    "host_calls", "measure"} (growth may be negative); None where it was not measured."""
    if before is None or after is None or before[1] != after[1]:
        return None
    return {"growth": after[0] - before[0], "host_calls": int(host_calls), "measure": after[1]}


def grown_past(report: dict | None, per: str, floor: int, limit: int) -> tuple[int, int, float] | None:
    """(growth, count, growth per count) of a heap report whose growth is above `floor` in all and
    above `limit` per `per` (the report's count: "host_calls", "threads"); None where it is not."""
    count = int((report or {}).get(per) or 0)
    if count <= 0:
        return None
    growth = int(report["growth"])
    return (growth, count, growth / count) if growth > floor and growth / count > limit else None


def host_leak_failure(entry: str, report: dict | None, what: str):
    """The leaked-memory Failure for the heap grown over `what` (the endurance run of `entry`), or
    None: a growth counts above HOST_GROWTH_LIMIT and above HOST_BYTES_PER_CALL_LIMIT per host call."""
    from .verdict import LEAKED_MEMORY, Failure

    if (grown := grown_past(report, "host_calls", HOST_GROWTH_LIMIT, HOST_BYTES_PER_CALL_LIMIT)) is None:
        return None
    growth, calls, per_call = grown
    measure = ("its malloc heap's bytes in use (mallinfo2)" if report.get("measure") == "mallinfo2"
               else "its resident set (VmRSS)")
    projected = per_call * PROJECTED_CALLS / 1e9
    return Failure(LEAKED_MEMORY, f"{what}: the host memory of the process making the calls grew by {growth} bytes "
                   f"over {calls} host calls of {entry} (measured as {measure} before and after): {per_call:.0f} "
                   f"bytes per call that the host code allocated and never freed. A server making {PROJECTED_CALLS:,} calls grows by "
                   f"{projected:.1f} GB until the host runs out of memory. Free every host allocation before "
                   f"returning (or keep one allocation per process and reuse it), and take per-call scratch from the "
                   f"workspace the ABI hands each call")


def heap_reply(code: int, failed: int | None, host_heap: dict | None) -> dict:
    """The candidate's process's reply to a measured run of calls (thread_exit.py, new_addresses.py):
    its code, the failing call or thread where one failed, and the heap report where there is one."""
    reply = {"type": "done", "code": code}
    if failed is not None:
        reply["failed_call"] = failed
    if host_heap is not None:
        reply["host_heap"] = host_heap
    return reply
