"""How long a process's threads have waited for a CPU: the share of a watchdog's wall time that a
loaded host took, not the kernel.

Linux counts, per thread, the time it was runnable but not running (`/proc/PID/task/TID/schedstat`,
second field, nanoseconds). On a host with more runnable threads than CPUs (session 37: 23
processes on 16 CPUs, nvcc jobs among them) an honest kernel's request waited past the verifier's
45 s watch with its process starved, not hung. A hung kernel's process is running (spinning on a
sync) or asleep (a blocking sync): neither is a wait for a CPU, so a hang still times out.
"""
from __future__ import annotations

import os


def _thread_waits(pid: int) -> dict[str, int]:
    """{thread id: nanoseconds it has waited for a CPU}; empty where Linux does not say."""
    waits = {}
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return waits
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stats:
                waits[tid] = int(stats.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return waits


class CpuWait:
    """The CPU wait of `pid`'s threads from now on: `seconds()` is the longest any one thread
    waited since (not their sum: two threads waiting at once are one wait of the process)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.before = _thread_waits(pid)

    def seconds(self) -> float:
        now = _thread_waits(self.pid)
        grown = [wait - self.before.get(tid, 0) for tid, wait in now.items()]
        return max(grown, default=0) / 1e9
