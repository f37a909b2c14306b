"""Full-size work sized to the GPU memory at hand.

A full-size case costs far more than its tensors: the reference in the working dtype, the
float64 truth with the reference's own temporaries (autograd's saved tensors in a backward),
the comparison's float64 temporaries and the arenas. On the H200 a gelu case of 10 GB of
tensors peaked at 108-124 GB in the judge (most of it the comparison's float64 temporaries,
now bounded by comparing a slice at a time), and two such judges cannot share a GPU. So the
verifier measures what one case element costs (a probe case of PROBE_ELEMENTS, prepared and
its peak read from torch's allocator) and plans each full-size case and each timed phase to
fit MEMORY_SHARE of the memory free when it holds the GPU (gpulock). A case it had to shrink is
named in the verdict.
"""
from __future__ import annotations

from typing import Callable

from .compare import CHUNK_ELEMENTS

PROBE_ELEMENTS = 1 << 22
MEMORY_SHARE = 0.75  # of the memory free at the time: the rest is the allocator's slack
CHECK_OVERHEAD = 1.5  # the two runs' outputs and the checks' masks on top of what preparing a case peaks at
# The comparison works a slice at a time (compare.CHUNK_ELEMENTS): about a dozen float64
# temporaries of one slice, whatever the case's size.
COMPARE_RESERVE = 12 * 8 * CHUNK_ELEMENTS
ARENA_BYTES_PER_ELEMENT = 10  # the staged copy (up to 8-byte elements) with the arena's 25% headroom
MIN_TIMED_SETS = 2


def available_bytes(device) -> int:
    """Free device memory plus what this process's allocator holds unused."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def bytes_per_element(prepare_probe: Callable[[], object], elements: int, device) -> float:
    """Peak device bytes per case element of preparing (and then checking) one case."""
    import torch

    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    data = prepare_probe()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del data
    return CHECK_OVERHEAD * peak / max(elements, 1) + ARENA_BYTES_PER_ELEMENT


def elements_that_fit(per_element: float, available: int) -> int:
    return int(MEMORY_SHARE * max(available - COMPARE_RESERVE, 0) / max(per_element, 1e-9))


def timed_sets_that_fit(wanted: int, *, set_input_bytes: int, output_bytes: int, per_element: float,
                        elements: int, available: int) -> int:
    """How many input sets of one benchmark shape the timed phase can hold at once: each set's
    inputs stay staged, the outputs are copied per call, and one set's truth is derived at a
    time (prepare(later=True)). At least MIN_TIMED_SETS (then calls revisit a set)."""
    budget = MEMORY_SHARE * max(available - COMPARE_RESERVE, 0) - per_element * elements - 2 * output_bytes
    fit = int(budget // max(set_input_bytes * 1.25, 1))
    return max(MIN_TIMED_SETS, min(wanted, fit))
