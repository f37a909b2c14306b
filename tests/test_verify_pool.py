"""The candidate's process keeps the default pool's freed memory (specgen/verify/pool.py), as the
package's binding does: per-call workspaces are not mapped again after every synchronization."""
from __future__ import annotations

import ctypes

import pytest

from specgen.verify import arena, pool


class FakeDriver:
    """The three driver calls, recorded with what they were given."""

    def __init__(self, fail: str | None = None):
        self.calls, self.fail = [], fail

    def cuDeviceGet(self, handle, ordinal):
        self.calls.append(("cuDeviceGet", ordinal.value))
        ctypes.cast(handle, ctypes.POINTER(ctypes.c_int))[0] = 100 + ordinal.value
        return 0

    def cuDeviceGetDefaultMemPool(self, out, handle):
        self.calls.append(("cuDeviceGetDefaultMemPool", handle.value))
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 0xBEEF
        return 101 if self.fail == "pool" else 0

    def cuMemPoolSetAttribute(self, pool_handle, attribute, value):
        keep = ctypes.cast(value, ctypes.POINTER(ctypes.c_uint64))[0]
        self.calls.append(("cuMemPoolSetAttribute", pool_handle.value, attribute.value, keep))
        return 0

    def cuGetErrorName(self, code, name):
        return 0


def test_the_default_pool_of_the_device_keeps_everything_freed(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(arena, "driver", lambda: fake)
    pool.keep_freed_memory(1)
    assert fake.calls == [("cuDeviceGet", 1), ("cuDeviceGetDefaultMemPool", 101),
                          ("cuMemPoolSetAttribute", 0xBEEF, 4, 2**64 - 1)]  # 4: CU_MEMPOOL_ATTR_RELEASE_THRESHOLD


def test_a_driver_error_names_the_call(monkeypatch):
    fake = FakeDriver(fail="pool")
    monkeypatch.setattr(arena, "driver", lambda: fake)
    monkeypatch.setattr(arena, "_driver", fake)
    with pytest.raises(arena.ArenaError, match="cuDeviceGetDefaultMemPool failed: CUresult 101"):
        pool.keep_freed_memory(0)
