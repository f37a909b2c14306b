"""The starved pool is filled whatever granule the driver rounds its cap up to (pool.StarvedPool._fill).

Driver 580 on the H200 did not honour a 2 MiB cap as 2 MiB: eight allocations of 2 MiB left room, and
the check that every cudaMallocAsync fails was never run (session 38). A fake driver stands in for
the real one: it rounds the cap up to a granule, or ignores it.
"""
import ctypes

import pytest

from specgen.verify import pool


class CappedDriver:
    """cuMemAllocFromPoolAsync of a pool holding at most `capacity` bytes (None: no limit)."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.used = 0
        self.calls = 0

    def cuMemAllocFromPoolAsync(self, ptr_ref, size, pool_handle, stream):
        self.calls += 1
        if self.capacity is not None and self.used + size.value > self.capacity:
            return 2  # CUDA_ERROR_OUT_OF_MEMORY
        self.used += size.value
        return 0


def filled_by(driver) -> pool.StarvedPool:
    starved = pool.StarvedPool(0)
    starved.pool = ctypes.c_void_p(1)
    starved._fill(driver)
    return starved


@pytest.mark.parametrize("capacity", [2 << 20, 32 << 20, (48 << 20) + 4096, 512 << 20])
def test_the_pool_is_filled_until_the_smallest_allocation_fails(capacity):
    driver = CappedDriver(capacity)
    starved = filled_by(driver)
    assert starved.filled == driver.used
    assert capacity - driver.used < pool.SMALLEST_ALLOCATION  # no room left for the smallest allocation
    assert driver.calls < 200  # sizes double while they fit: a large granule is not 2 MiB at a time


def test_a_driver_that_ignores_the_cap_is_met_at_the_limit():
    with pytest.raises(RuntimeError, match="still grew past"):
        filled_by(CappedDriver(None))
