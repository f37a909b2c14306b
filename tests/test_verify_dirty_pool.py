"""A default memory pool left dirty by another user (specgen/verify/dirty_pool.py, verifier version 16).

Held-out attacks-v11's bias_gelu_a keeps its "last block" tickets in 4 KiB of cudaMallocAsync scratch it
never zeroes: in the candidate's process nothing else allocates from the default pool, so the block is
always fresh (zero) or its own counters, put back at zero, and it passed version 15. In a process that
shares the pool (PyTorch with backend:cudaMallocAsync, CuPy, other ops) the block holds another user's
bytes. On the GPU the pool is dirtied through the driver (PoolDirtier, checked here against a fake
driver that models a pool's reserved and used bytes); the CPU stand-ins take their "cudaMallocAsync"
from CpuDevicePool, which the stand-in runner dirties the same way. Which blocks a real pool hands back
after the dirtying is not modelled here: that part runs only on a GPU (not yet run on one).
"""
from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch

import verify_fakes as fakes
from conftest import SPECS
from specgen.spec import load_spec
from specgen.verify import arena, dirty_pool, pool
from specgen.verify.data import prepare, stage
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import LocalRunner
from specgen.verify.strategies import make_case

QUICK = Options(examples=3, budget=1 << 13, seed=1, endurance=0, directions=("forward",))


# ------------------------------------------------------------------ the driver's side, against a fake pool

class FakePoolDriver:
    """cuMemAllocAsync / cuMemsetD32Async / cuMemFreeAsync / cuMemPoolGetAttribute of a pool that reserves
    CHUNK bytes at a time and suballocates best-fit from its free pieces; `kept` pieces are free memory the
    pool holds from earlier calls (never handed out yet, or handed back)."""

    CHUNK = 2 << 20

    def __init__(self, kept=(), fail_after: int | None = None, attributes: bool = True):
        self.pieces = list(kept)
        self.reserved, self.used = sum(kept), 0
        self.next_ptr, self.blocks, self.memsets, self.freed, self.streams = 0x10000, {}, {}, [], set()
        self.fail_after, self.attributes = fail_after, attributes

    def cuMemAllocAsync(self, ptr_ref, size, stream):
        if self.fail_after is not None and len(self.blocks) >= self.fail_after:
            return 2  # CUDA_ERROR_OUT_OF_MEMORY
        self.streams.add(stream.value)
        n = size.value
        fits = [i for i, p in enumerate(self.pieces) if p >= n]
        if fits:
            best = min(fits, key=lambda i: self.pieces[i])
            self.pieces[best] -= n
        else:
            grown = -(-n // self.CHUNK) * self.CHUNK
            self.reserved += grown
            self.pieces.append(grown - n)
        self.used += n
        ctypes.cast(ptr_ref, ctypes.POINTER(ctypes.c_uint64))[0] = self.next_ptr
        self.blocks[self.next_ptr] = n
        self.next_ptr += n
        return 0

    def cuMemsetD32Async(self, ptr, value, count, stream):
        self.memsets[ptr.value] = (value.value, count.value)
        return 0

    def cuMemFreeAsync(self, ptr, stream):
        self.freed.append(ptr.value)
        self.streams.add(stream.value)
        return 0

    def cuMemPoolGetAttribute(self, pool_handle, attribute, value):
        if not self.attributes:
            return 1
        answer = {dirty_pool.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: self.reserved,
                  dirty_pool.CU_MEMPOOL_ATTR_USED_MEM_CURRENT: self.used}[attribute.value]
        ctypes.cast(value, ctypes.POINTER(ctypes.c_uint64))[0] = answer
        return 0

    def cuCtxSynchronize(self):
        return 0


def dirtied(driver, stream: int = 0x7F00, seed: int = 3) -> dirty_pool.PoolDirtier:
    dirtier = dirty_pool.PoolDirtier(driver, ctypes.c_void_p(0xBEEF), stream, seed)
    dirtier.fill()
    return dirtier


@pytest.mark.parametrize("kept", [(), (3 << 20, 1 << 20, 4096 + 512), (64 << 20,)])
def test_every_block_is_filled_with_non_zero_bytes_and_given_back_and_the_kept_memory_too(kept):
    driver = FakePoolDriver(kept)
    dirtier = dirtied(driver)
    assert set(dirty_pool.DIRTY_SIZES) <= set(dirtier.sizes)  # a spread: a few hundred bytes to 8 MiB
    assert sorted(driver.freed) == sorted(driver.blocks)  # every block handed back to the pool (it keeps them)
    for ptr, size in driver.blocks.items():
        value, count = driver.memsets[ptr]
        assert count * 4 == size  # the whole block
        assert all(value.to_bytes(4, "little"))  # no zero byte: a counter or flag read from it is never 0
    assert len(set(dirtier.patterns)) > 1  # a pattern per block
    assert driver.reserved - driver.used < dirty_pool.SMALLEST  # no reserved byte left that no block covered
    assert driver.streams == {0x7F00}  # on the call's stream


def test_the_legacy_stream_is_handle_0_and_the_patterns_follow_the_seed():
    one, two, other = (dirtied(FakePoolDriver(), 0, seed) for seed in (5, 5, 6))
    assert one.patterns == two.patterns != other.patterns


def test_a_pool_that_fails_halfway_still_gets_every_block_back():
    driver = FakePoolDriver(fail_after=5)
    assert dirtied(driver).total > 0
    assert sorted(driver.freed) == sorted(driver.blocks)


def test_without_the_pool_attributes_the_spread_is_still_dirtied():
    driver = FakePoolDriver((8 << 20,), attributes=False)
    dirtier = dirtied(driver)
    assert sorted(dirtier.sizes) == sorted(dirty_pool.DIRTY_SIZES * dirty_pool.DIRTY_COPIES)


def test_a_pool_that_gives_nothing_is_a_check_not_run(monkeypatch):
    fake = FakePoolDriver(fail_after=0)
    monkeypatch.setattr(arena, "driver", lambda: fake)
    monkeypatch.setattr(pool, "default_pool", lambda device: ctypes.c_void_p(0xBEEF))
    assert "could not be dirtied" in dirty_pool.dirty_default_pool(0, 0, 1)
    assert dirty_pool.dirty_default_pool(0, 0, 1) == dirty_pool.dirty_default_pool(0, 0, 2)
    fake.fail_after = None
    assert dirty_pool.dirty_default_pool(0, 0, 1) is None


# ------------------------------------------------------------------ the CPU stand-in's pool

def test_a_stand_in_pool_hands_back_what_its_last_user_left():
    owner = fakes.PyKernel(None, fakes.gelu_forward)
    mine = dirty_pool.pool_of(owner)
    assert dirty_pool.pool_of(owner) is mine
    block = mine.malloc(4096)
    assert block.numel() == 4096 and not block.any()  # fresh: zero
    block.fill_(7)
    mine.free(block)
    assert (mine.malloc(4096) == 7).all()  # its own bytes, as it left them
    mine.free(block)
    mine.dirty(seed=1)
    again = mine.malloc(4000)
    assert again.numel() == 4000 and bool((again != 0).all())  # another user's bytes, none zero
    mine.free(again)
    owner.allocations_fail = True
    assert mine.malloc(16) is None  # the starved call's failing allocation


# ------------------------------------------------------------------ the check, on CPU stand-ins

TILE_COLUMNS, TILE_ROWS = 64, 8


def counters_in_pool(zeroed: bool):
    """GELU written tile by tile by each column tile's "last block", found by tickets taken from a
    counter per tile in 4 KiB of pool scratch (bias_gelu_a's scheme). `zeroed`: the counters zeroed
    first (cudaMemsetAsync on `stream`); else assumed zero because fresh pool memory is zero and the
    last block puts its counter back to zero."""
    def forward(k, t, dims):
        counters_bytes = dirty_pool.pool_of(k).malloc(4096)
        if counters_bytes is None:
            return 2  # cudaErrorMemoryAllocation, before launching anything
        counters = counters_bytes.view(torch.int32)
        if zeroed:
            counters.zero_()
        x, out = t["x"].reshape(-1, t["x"].shape[-1]), t["out"].reshape(-1, t["out"].shape[-1])
        chunks = -(-x.shape[0] // TILE_ROWS)  # blocks per column tile, each taking one ticket in turn
        for tile in range(-(-x.shape[1] // TILE_COLUMNS)):
            cols, slot = slice(tile * TILE_COLUMNS, (tile + 1) * TILE_COLUMNS), tile % counters.numel()
            found = int(counters[slot])
            if 0 <= found <= chunks - 1:  # some block draws ticket chunks - 1: the tile's "last" block
                done = (chunks - found) * TILE_ROWS  # the rows whose blocks had taken their tickets by then
                out[:done, cols].copy_(fakes._gelu(x[:done, cols]))
                counters[slot] = found  # put back to 0, then the blocks after it took theirs
            else:  # no block is ever last: the tile is never written
                counters[slot] = (found + chunks + (1 << 31)) % (1 << 32) - (1 << 31)
        dirty_pool.pool_of(k).free(counters_bytes)
        return 0
    return forward


@pytest.fixture(scope="module")
def gelu():
    return load_spec(SPECS / "gelu_tanh.yaml")


def staged(spec, kernel, dims=None):
    runner = LocalRunner(spec, kernel, "cpu")
    data = prepare(spec, make_case(dims or {"N": 37, "D": 200}, "float32", seed=4), "forward", "cpu")
    stage(runner, data, snapshots=False)
    return runner, data


def test_counters_assumed_zero_in_pool_memory_are_rejected_naming_the_fix(gelu):
    kernel = fakes.PyKernel(gelu, counters_in_pool(zeroed=False))
    runner, data = staged(gelu, kernel)
    from specgen.verify.runner import run_once

    run_once(runner, data, 0)  # alone in its process: every block fresh, or its own counters back at 0
    assert torch.allclose(runner.tensor(data.output_refs["out"]), fakes._gelu(data.inputs["x"]), atol=1e-6)
    from specgen.verify.verdict import Failure

    with pytest.raises(Failure) as caught:
        dirty_pool.check_dirty_pool(runner, data, "legacy", seed=9)
    assert caught.value.reason == "wrong-result"
    assert "left dirty by another user" in caught.value.detail and "call 1 of 2" in caught.value.detail
    assert "cudaMemsetAsync on `stream`" in caught.value.detail and "workspace" in caught.value.detail
    assert dirty_pool.pool_of(kernel).dirtied == 1


def test_counters_zeroed_every_call_pass_on_a_dirty_pool(gelu):
    kernel = fakes.PyKernel(gelu, counters_in_pool(zeroed=True))
    runner, data = staged(gelu, kernel, {"N": 70, "D": 300})
    assert dirty_pool.check_dirty_pool(runner, data, "pool", seed=9) is None
    assert dirty_pool.pool_of(kernel).dirtied == dirty_pool.DIRTY_CALLS
    assert kernel.calls == dirty_pool.DIRTY_CALLS + 1


def test_counters_zeroed_on_the_first_call_only_are_rejected(gelu):
    """Zeroes its counters on the process's first call and trusts them to be handed back at 0."""
    def forward(k, t, dims):
        return counters_in_pool(zeroed=k.calls == 1)(k, t, dims)
    runner, data = staged(gelu, fakes.PyKernel(gelu, forward))
    from specgen.verify.verdict import Failure

    with pytest.raises(Failure, match="left dirty"):
        dirty_pool.check_dirty_pool(runner, data, "legacy")


# ------------------------------------------------------------------ through the engine

def test_the_engine_runs_it_per_direction_and_names_a_pool_it_could_not_dirty(gelu, monkeypatch):
    calls = []
    real = dirty_pool.check_dirty_pool

    def recorded(runner, data, stream="pool", seed=0):
        calls.append((data.direction, data.case.describe(), stream))
        return real(runner, data, stream, seed)
    monkeypatch.setattr(dirty_pool, "check_dirty_pool", recorded)
    monkeypatch.setattr(dirty_pool, "dirty_before_call", lambda *a: "no pool here")
    verdict = run_verification(gelu, fakes.PyKernel(gelu, counters_in_pool(zeroed=False)),
                               dataclasses.replace(QUICK, full_size=False), device="cpu")
    assert verdict.reason == "passed", verdict.summary()  # never dirtied: the cheat is not met
    assert calls == [("forward", calls[0][1], "legacy")]  # the first case's pool could not be dirtied: not run
    assert "left dirty: not run (no pool here)" in verdict.timings["scaled to GPU memory"]


def test_the_engine_rejects_counters_assumed_zero_and_passes_zeroed_ones(gelu):
    verdict = run_verification(gelu, fakes.PyKernel(gelu, counters_in_pool(zeroed=False)), QUICK, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert "left dirty by another user" in verdict.detail and "cudaMemsetAsync" in verdict.detail
    honest = fakes.PyKernel(gelu, counters_in_pool(zeroed=True))
    verdict = run_verification(gelu, honest, QUICK, device="cpu")
    assert verdict.reason == "passed", verdict.summary()
    assert dirty_pool.pool_of(honest).dirtied == 2 * dirty_pool.DIRTY_CALLS  # the smoke and the large case


# ------------------------------------------------------------------ the calls as a C driver receives them

FAKE_LIBCUDA = r"""
#include <stddef.h>
#include <stdint.h>
uint64_t next_ptr = 0x100000, reserved = 3u << 20, used = 0;
uint64_t alloc_sizes[512], alloc_ptrs[512], set_ptrs[512], set_counts[512], freed[512];
unsigned set_values[512];
void* streams[1024];
int allocs = 0, sets = 0, frees = 0, stream_uses = 0;
int cuMemAllocAsync(uint64_t* dptr, size_t size, void* stream) {
  if (allocs >= 512) return 2;
  *dptr = next_ptr; next_ptr += size; used += size;
  if (used > reserved) reserved = (used + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  alloc_sizes[allocs] = size; alloc_ptrs[allocs++] = *dptr; streams[stream_uses++] = stream;
  return 0;
}
int cuMemsetD32Async(uint64_t ptr, unsigned value, size_t count, void* stream) {
  set_ptrs[sets] = ptr; set_values[sets] = value; set_counts[sets++] = count; streams[stream_uses++] = stream;
  return 0;
}
int cuMemFreeAsync(uint64_t ptr, void* stream) { freed[frees++] = ptr; streams[stream_uses++] = stream; return 0; }
int cuMemPoolGetAttribute(void* pool, int attribute, uint64_t* value) {
  if (pool != (void*)0xBEEF) return 1;
  if (attribute == 5) { *value = reserved; return 0; }
  if (attribute == 7) { *value = used; return 0; }
  return 1;
}
"""


def test_the_driver_gets_its_arguments_as_c_has_them(tmp_path):
    """PoolDirtier's ctypes calls (no argtypes: each argument's type given at the call) against a C
    library with the driver's signatures: pointers, sizes, the pattern and the stream arrive whole."""
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    source = tmp_path / "fake_libcuda.c"
    source.write_text(FAKE_LIBCUDA)
    library = tmp_path / "libfakecuda.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True)
    native = ctypes.CDLL(str(library))
    stream = 0x7F3A5C000010
    dirtier = dirty_pool.PoolDirtier(native, ctypes.c_void_p(0xBEEF), stream, seed=2)
    dirtier.fill()

    def read(name, kind, count):
        return list((kind * count).in_dll(native, name))
    allocs, sets, frees = (ctypes.c_int.in_dll(native, n).value for n in ("allocs", "sets", "frees"))
    assert allocs == sets == frees == len(dirtier.sizes)
    assert read("alloc_sizes", ctypes.c_uint64, allocs) == dirtier.sizes
    assert read("set_ptrs", ctypes.c_uint64, sets) == read("alloc_ptrs", ctypes.c_uint64, allocs)
    assert read("set_values", ctypes.c_uint, sets) == dirtier.patterns
    assert [4 * n for n in read("set_counts", ctypes.c_uint64, sets)] == dirtier.sizes
    assert sorted(read("freed", ctypes.c_uint64, frees)) == sorted(read("alloc_ptrs", ctypes.c_uint64, allocs))
    uses = ctypes.c_int.in_dll(native, "stream_uses").value
    assert set(read("streams", ctypes.c_void_p, uses)) == {stream}
    reserved, used = (ctypes.c_uint64.in_dll(native, n).value for n in ("reserved", "used"))
    assert reserved - used < dirty_pool.SMALLEST  # the top-up read the attributes and filled the pool's rest
