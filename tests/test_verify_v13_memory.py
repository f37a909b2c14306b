"""Verifier version 13: memory a kernel keeps from the process without leaking it in the pool's
bytes in use (held-out attacks-v10): scratch parked in the device's default pool
(cudaMallocAsync'd and freed, kept reserved by the pool), local memory the driver reserves for the
context's life (a large per-thread array), and host memory leaked per call (`new` never freed).

On the CPU: the measurements that need no GPU (the malloc heap) and the judge's bounds; on a GPU
(marked `gpu`): the driver's readings, and the three cheats through the verifier's normal path."""
from __future__ import annotations

import ctypes

import pytest

import verify_fakes as fakes
from conftest import REPO, SPECS
from specgen.spec import load_spec
from specgen.verify import arena, host_memory, local_memory, pool
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import local_memory_failure, parked_memory_failure
from specgen.verify.verdict import LEAKED_MEMORY

MiB = 1 << 20


@pytest.fixture
def softmax():
    return load_spec(SPECS / "softmax.yaml")


# ------------------------------------------------------------------ the malloc heap (host memory)

def _libc():
    libc = ctypes.CDLL(None)
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    return libc


def test_the_heap_measurement_sees_memory_allocated_and_never_freed():
    libc = _libc()
    before = host_memory.heap_in_use()
    assert before is not None
    size = 2 * max(host_memory.HOST_GROWTH_LIMIT // 2000, host_memory.HOST_BYTES_PER_CALL_LIMIT, 4096)
    kept = [libc.malloc(size) for _ in range(2000)]  # never freed until the end of the test
    after = host_memory.heap_in_use()
    report = host_memory.growth_report(before, after, 2000)
    try:
        assert report is not None and report["host_calls"] == 2000
        assert report["growth"] >= 0.95 * 2000 * size, report
        failure = host_memory.host_leak_failure("gelu_tanh_forward", report, "2000 calls in a row")
        assert failure is not None and failure.reason == LEAKED_MEMORY
    finally:
        for pointer in kept:
            libc.free(pointer)


def test_the_heap_measurement_does_not_count_memory_freed():
    libc = _libc()
    before = host_memory.heap_in_use()
    for _ in range(2000):
        libc.free(libc.malloc(4096))
    report = host_memory.growth_report(before, host_memory.heap_in_use(), 2000)
    assert report is not None and report["growth"] < 1 * MiB, report
    assert host_memory.host_leak_failure("gelu_tanh_forward", report, "2000 calls in a row") is None


def test_mallinfo2_is_read_where_glibc_has_it_else_the_resident_set(monkeypatch):
    measured = host_memory.heap_in_use()
    assert measured is not None and measured[0] > 0
    if host_memory._mallinfo2() is not None:
        assert measured[1] == "mallinfo2"
    monkeypatch.setattr(host_memory, "_mallinfo2", lambda: None)
    fallback = host_memory.heap_in_use()
    assert fallback is not None and fallback[1] == "VmRSS" and fallback[0] > 1 * MiB
    # the two measures are never compared with each other
    assert host_memory.growth_report((0, "mallinfo2"), (5 * MiB, "VmRSS"), 100) is None


GROWTH, PER_CALL = host_memory.HOST_GROWTH_LIMIT, host_memory.HOST_BYTES_PER_CALL_LIMIT


@pytest.mark.parametrize("growth, calls, failing", [
    (40_000 * 294, 40_000, False),  # 294 bytes per call: an honest process's own growth on the H200
    (2 * GROWTH, 4 * GROWTH // PER_CALL, False),  # above the run's bound, half the bound per call
    (GROWTH - 1, 10, False),  # far above the bound per call, under the run's bound
    (GROWTH, 10, False),  # the run's bound itself
    (40_000 * 2314, 40_000, True),  # 2.26 KiB per call: `new` never freed
    (2 * GROWTH, GROWTH // PER_CALL, True),  # twice both bounds
])
def test_the_host_growth_bounds(growth, calls, failing):
    report = {"growth": growth, "host_calls": calls, "measure": "mallinfo2"}
    failure = host_memory.host_leak_failure("gelu_tanh_forward", report, "120000 calls in a row on N=1 D=64")
    assert (failure is not None) == failing
    if failing:
        per_call = growth / calls
        assert failure.reason == LEAKED_MEMORY
        assert f"{per_call:.0f} bytes per call" in failure.detail and f"{growth} bytes" in failure.detail
        assert "10,000,000 calls grows by" in failure.detail and f"{per_call * 1e7 / 1e9:.1f} GB" in failure.detail
        assert "120000 calls in a row" in failure.detail and "gelu_tanh_forward" in failure.detail


def test_no_host_growth_report_is_no_failure():
    assert host_memory.host_leak_failure("f", None, "x") is None
    assert host_memory.host_leak_failure("f", {"growth": 100 * MiB, "host_calls": 0}, "x") is None
    assert host_memory.host_leak_failure("f", {"growth": -100 * MiB, "host_calls": 10}, "x") is None


ENDURANCE = 1000
LEAK_BYTES = 2 * max(GROWTH // ENDURANCE, PER_CALL)  # above both bounds over the CPU stand-ins' endurance run


def leaking_gelu(k, t, dims):
    """Right outputs; LEAK_BYTES of host memory (malloc'd through Python's allocator) kept per call."""
    k.kept = getattr(k, "kept", [])
    k.kept.append(bytearray(LEAK_BYTES))
    return fakes.gelu_forward(k, t, dims)


@pytest.mark.parametrize("impl, reason", [(fakes.gelu_forward, "passed"), (leaking_gelu, "leaked-memory")])
def test_the_endurance_run_rejects_host_memory_leaked_per_call(impl, reason):
    spec = load_spec(SPECS / "gelu_tanh.yaml")
    options = Options(examples=0, budget=1 << 12, full_size=False, directions=("forward",), endurance=ENDURANCE,
                      seed=1)
    verdict = run_verification(spec, fakes.PyKernel(spec, impl), options, device="cpu")
    assert verdict.reason == reason, verdict.summary()
    if reason != "passed":
        assert "bytes per call" in verdict.detail and f"{ENDURANCE} calls in a row" in verdict.detail


# ------------------------------------------------------------------ scratch parked in the default pool

def test_the_candidate_reports_what_it_parked_and_the_judge_holds_it_to_64_mib(softmax):
    """One place decides (session 40 review): the candidate's process reports the bytes parked above
    those in use before, whatever the amount; the judge applies the bound."""
    assert pool.PARKED_BYTES_LIMIT == 64 * MiB
    message = {"op": "call", "calls": [{"direction": "forward"}]}
    at_bound = pool.parked_report(10 * MiB, 10 * MiB + 64 * MiB, "call")
    assert at_bound == {"bytes": 64 * MiB, "op": "call"} and parked_memory_failure(softmax, message, at_bound) is None
    above = pool.parked_report(10 * MiB, 10 * MiB + 64 * MiB + 1, "call")
    assert above == {"bytes": 64 * MiB + 1, "op": "call"}
    assert parked_memory_failure(softmax, message, above).reason == LEAKED_MEMORY
    assert pool.parked_report(None, 600 * MiB, "call") is None and pool.parked_report(0, None, "call") is None
    assert pool.parked_report(10 * MiB, 10 * MiB, "call") is None  # nothing parked


def test_scratch_parked_in_the_pool_is_leaked_memory(softmax):
    message = {"op": "timed", "calls": [{"direction": "backward"}]}
    assert parked_memory_failure(softmax, message, {"bytes": 64 * MiB, "op": "timed"}) is None
    assert parked_memory_failure(softmax, message, None) is None
    failure = parked_memory_failure(softmax, message, {"bytes": 512 * MiB, "op": "timed"})
    assert failure is not None and failure.reason == LEAKED_MEMORY
    detail = failure.detail
    assert "512.0 MiB" in detail and "cudaMallocAsync" in detail and "softmax_backward" in detail
    assert "The timed calls" in detail and "64 MiB" in detail and "softmax_backward_workspace" in detail
    assert "PyTorch's caching allocator can never reuse it" in detail


def test_the_honest_scratch_of_the_test_kernels_stays_under_the_bound():
    # tests/kernels take one float per row with cudaMallocAsync: at the largest row count of any
    # spec's benchmark (16384 rows) that is 64 KiB
    for name in ("rmsnorm.cu", "rmsnorm__warp_per_row.cu"):
        assert "a->N * sizeof(float)" in (REPO / "tests" / "kernels" / name).read_text()
    assert parked_memory_failure(None, {"op": "call"}, pool.parked_report(0, 16384 * 4, "call")) is None


def test_the_candidate_reads_no_pool_peak_where_there_is_no_gpu():
    import torch

    from specgen.verify.candidate_main import LEAK_CHECKED, parked_in_pool
    from specgen.verify.pool import reset_peak

    if torch.cuda.is_available():
        pytest.skip("reads the device's pool on a GPU")
    assert reset_peak(0) is False  # no driver: nothing happens
    assert parked_in_pool(0, 0, "call") is None
    assert "timed" in LEAK_CHECKED and "capture" not in LEAK_CHECKED


class PeakDriver:
    """The pool calls of pool.reset_peak and pool.peak_bytes, recorded."""

    def __init__(self):
        self.calls = []

    def cuDeviceGet(self, handle, ordinal):
        return 0

    def cuDeviceGetDefaultMemPool(self, out, handle):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 0xBEEF
        return 0

    def cuMemPoolSetAttribute(self, pool_handle, attribute, value):
        self.calls.append(("set", attribute.value, ctypes.cast(value, ctypes.POINTER(ctypes.c_uint64))[0]))
        return 0

    def cuMemPoolGetAttribute(self, pool_handle, attribute, value):
        self.calls.append(("get", attribute.value))
        ctypes.cast(value, ctypes.POINTER(ctypes.c_uint64))[0] = 123 * MiB
        return 0

    def cuCtxGetLimit(self, value, limit):
        self.calls.append(("limit", limit.value))
        ctypes.cast(value, ctypes.POINTER(ctypes.c_size_t))[0] = 16384
        return 0


def test_the_pool_peak_is_reset_with_zero_and_read_from_the_high_water_mark(monkeypatch):
    fake = PeakDriver()
    monkeypatch.setattr(arena, "driver", lambda: fake)
    assert pool.reset_peak(0) is True
    assert pool.peak_bytes(0) == 123 * MiB
    assert fake.calls == [("set", 8, 0), ("get", 8)]  # 8: CU_MEMPOOL_ATTR_USED_MEM_HIGH


def test_the_driver_readings_are_none_without_a_driver(monkeypatch):
    def no_driver():
        raise arena.ArenaError("no libcuda here")

    monkeypatch.setattr(arena, "driver", no_driver)
    assert pool.reset_peak(0) is False and pool.peak_bytes(0) is None and local_memory.stack_limit() is None


# ------------------------------------------------------------------ local memory reserved for the context

def test_the_stack_limit_is_read_with_cu_limit_stack_size(monkeypatch):
    fake = PeakDriver()
    monkeypatch.setattr(arena, "driver", lambda: fake)
    assert local_memory.stack_limit() == 16384
    assert fake.calls == [("limit", 0)]  # 0: CU_LIMIT_STACK_SIZE


H100_THREADS = 2048 * 132


def test_a_stack_grown_below_the_bound_then_past_it_is_reported_again():
    """Reported as it grows: a first growth below the bound does not hide a later one past it."""
    first = local_memory.stack_report(2048, 1024, 1024, H100_THREADS, "call")
    assert first is not None and local_memory_failure(None, {"op": "call"}, first) is None
    assert local_memory.stack_report(2048, first["stack_bytes"], 1024, H100_THREADS, "call") is None
    later = local_memory.stack_report(16384, first["stack_bytes"], 1024, H100_THREADS, "call")
    assert local_memory_failure(None, {"op": "call"}, later) is not None


@pytest.mark.parametrize("limit, baseline, reported, failed", [
    (1024, 1024, False, False),  # the default: no growth, no report
    (4096, 1024, True, False),  # grown, to the bound itself: reported, the judge lets it pass
    (8192, 8192, False, False),  # no higher than when the context was made (not the kernel's doing)
    (16384, 1024, True, True),  # a 16 KiB per-thread array
    (8192, None, True, True),  # no baseline read: the bound alone
    (None, 1024, False, False),  # not read
])
def test_the_stack_bounds(limit, baseline, reported, failed, softmax):
    """The candidate reports the limit as it grows; the judge alone applies the bound and the
    baseline (one place decides: session 40 review)."""
    report = local_memory.stack_report(limit, baseline, baseline, H100_THREADS, "call")
    assert (report is not None) == reported
    failure = local_memory_failure(softmax, {"op": "call", "direction": "forward"}, report)
    assert (failure is not None) == failed
    if failed:
        assert report["reserved_bytes"] == limit * H100_THREADS
        assert failure.reason == LEAKED_MEMORY
        assert f"{limit} bytes of local memory per thread" in failure.detail
        assert f"{limit * H100_THREADS / 1e9:.1f} GB" in failure.detail and "softmax_forward" in failure.detail
        assert "shared memory" in failure.detail and "4096 bytes" in failure.detail


def test_a_16_kib_stack_on_an_h100_reserves_4_4_gb(softmax):
    report = local_memory.stack_report(16384, 1024, 1024, H100_THREADS, "load")
    failure = local_memory_failure(softmax, {"op": "load"}, report)
    assert "reserve 4.4 GB of device memory" in failure.detail and "loading the kernel library" in failure.detail
    # the judge applies the bounds itself too: a report at the baseline is no failure
    assert local_memory_failure(softmax, {"op": "call"}, {"stack_bytes": 8192, "baseline": 8192}) is None


# ------------------------------------------------------------------ on a GPU

LOCAL_ARRAY_SOURCE = r"""
#include <cuda_runtime.h>
__global__ void big_local(float* out, int n, int seed) {
  volatile float scratch[4096];  // 16 KiB per thread, indexed at run time: local memory
  for (int i = 0; i < 4096; ++i) scratch[(i * seed) & 4095] = (float)i;
  out[threadIdx.x] = scratch[(threadIdx.x * seed + n) & 4095];
}
extern "C" int launch_big_local(float* out, int n) {
  big_local<<<1, 32>>>(out, n, 7);
  return (int)cudaDeviceSynchronize();
}
"""


@pytest.mark.gpu
def test_the_stack_limit_is_read_on_a_gpu():
    import torch

    torch.empty(1, device="cuda")
    limit = local_memory.stack_limit()
    assert limit is not None and limit >= 1024
    threads = local_memory.resident_threads(torch, torch.cuda.current_device())
    assert threads is not None and threads >= 2048 * 8


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_16_kib_local_array_raises_the_stack_limit(tmp_path):
    """In a process of its own: the limit raised here would stay raised for the rest of the tests."""
    import os
    import subprocess
    import sys

    from specgen.toolchain.compile import compile_kernel

    library = compile_kernel(LOCAL_ARRAY_SOURCE, name="big_local", cache_dir=tmp_path).library
    script = (
        "import ctypes, sys, torch\n"
        "from specgen.verify.local_memory import stack_limit\n"
        "torch.empty(1, device='cuda')\n"
        "before = stack_limit()\n"
        f"lib = ctypes.CDLL({str(library)!r})\n"
        "out = torch.zeros(32, device='cuda')\n"
        "code = lib.launch_big_local(ctypes.c_void_p(out.data_ptr()), ctypes.c_int(3))\n"
        "print(before, stack_limit(), code)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr
    before, after, code = map(int, run.stdout.split()[-3:])
    assert code == 0
    assert before <= local_memory.STACK_BYTES_LIMIT < 16384 <= after
    assert local_memory_failure(None, {"op": "call"}, local_memory.stack_report(after, before, before, 2048 * 132,
                                                                                "call")) is not None


@pytest.mark.gpu
def test_the_pool_peak_sees_scratch_taken_and_freed():
    import torch

    from specgen.verify.arena import driver

    torch.empty(1, device="cuda")
    device = torch.cuda.current_device()
    torch.cuda.synchronize()
    before = pool.used_bytes(device)
    assert pool.reset_peak(device)
    drv = driver()
    pointer = ctypes.c_uint64()
    assert drv.cuMemAllocAsync(ctypes.byref(pointer), ctypes.c_size_t(128 * MiB), ctypes.c_void_p(0)) == 0
    assert drv.cuMemFreeAsync(pointer, ctypes.c_void_p(0)) == 0
    torch.cuda.synchronize()
    assert pool.used_bytes(device) == before  # freed: the leak check sees nothing
    peak = pool.peak_bytes(device)
    assert peak is not None and peak - before >= 128 * MiB
    assert parked_memory_failure(None, {"op": "call"}, pool.parked_report(before, peak, "call")) is not None
    assert pool.reset_peak(device) and pool.peak_bytes(device) == before  # reset to the bytes in use now


# ------------------------------------------------------------------ the three cheats through the verifier

GELU = (REPO / "tests" / "kernels" / "gelu_tanh.cu").read_text()
GELU_FORWARD_LAUNCH = ("  DISPATCH(a->x.dtype, gelu_fwd<T><<<blocks_for(n), 256, 0, stream>>>((const T*)a->x.data, "
                       "(T*)a->out.data, n));\n")
CHEATS = {
    # a float32 copy of the whole input staged in scratch from the default pool, freed after
    "parked_scratch": (r"""
template <typename T> __global__ void stage_in(const T* x, float* s, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    s[i] = load(x, i);
}
template <typename T> __global__ void gelu_staged(const float* s, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = s[i];
    store(y, i, 0.5f * v * (1.0f + tanhf(kBeta * (v + kKappa * v * v * v))));
  }
}
""", """  float* staged = nullptr;
  cudaError_t err = cudaMallocAsync((void**)&staged, n * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  DISPATCH(a->x.dtype, stage_in<T><<<blocks_for(n), 256, 0, stream>>>((const T*)a->x.data, staged, n));
  DISPATCH(a->x.dtype, gelu_staged<T><<<blocks_for(n), 256, 0, stream>>>(staged, (T*)a->out.data, n));
  cudaFreeAsync(staged, stream);
"""),
    # a 16 KiB per-thread array indexed at run time
    "local_array": (r"""
template <typename T> __global__ void gelu_local(const T* x, T* y, int64_t n) {
  volatile float seen[4096];
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = load(x, i);
    seen[i & 4095] = v;
    v = seen[i & 4095];
    store(y, i, 0.5f * v * (1.0f + tanhf(kBeta * (v + kKappa * v * v * v))));
  }
}
""", "  DISPATCH(a->x.dtype, gelu_local<T><<<blocks_for(n), 256, 0, stream>>>((const T*)a->x.data, "
     "(T*)a->out.data, n));\n"),
    # 2 KiB of host memory per call, never freed
    "host_leak": (r"""
static char* volatile g_last_plan = nullptr;
""", "  { char* plan = new char[2048]; plan[0] = (char)n; g_last_plan = plan; }\n" + GELU_FORWARD_LAUNCH),
}


def cheat_source(name: str) -> str:
    prelude, launch = CHEATS[name]
    assert GELU_FORWARD_LAUNCH in GELU
    source = GELU.replace("static int blocks_for", prelude + "\nstatic int blocks_for", 1)
    return source.replace(GELU_FORWARD_LAUNCH, launch, 1)


def test_the_cheats_are_the_good_kernel_changed_in_its_forward():
    for name in CHEATS:
        source = cheat_source(name)
        assert source != GELU and "gelu_tanh_backward" in source and "gelu_tanh_forward" in source


@pytest.mark.nvcc
def test_the_cheats_pass_the_static_checks_and_the_local_array_is_a_16_kib_frame(tmp_path):
    """The cheats reach the run (where version 13 catches them): they compile, and no symbol of
    theirs is refused (cudaMallocAsync and the host's operator new are allowed)."""
    from specgen.toolchain.compile import compile_kernel
    from specgen.verify import static_checks

    spec = load_spec(SPECS / "gelu_tanh.yaml")
    for name in CHEATS:
        verdict, compiled = static_checks(spec, cheat_source(name), arch="sm_90", cache_dir=tmp_path)
        assert verdict is None, verdict.summary()
        frames = [r["stack_bytes"] for kernel, r in compiled.resources.items() if "gelu_local" in kernel]
        assert frames == ([16384] * 3 if name == "local_array" else []), (name, frames)
    probe = compile_kernel(LOCAL_ARRAY_SOURCE, name="big_local", cache_dir=tmp_path, arch="sm_90")
    assert [r["stack_bytes"] for r in probe.resources.values()] == [16384]


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("name, words", [("local_array", "bytes of local memory per thread"),
                                         ("parked_scratch", "of scratch from the device's default memory pool"),
                                         ("host_leak", "bytes per call")])
def test_each_memory_cheat_is_rejected_by_the_verifier(name, words, tmp_path):
    from specgen.verify import verify_kernel

    spec = load_spec(SPECS / "gelu_tanh.yaml")
    verdict = verify_kernel(spec, cheat_source(name), examples=3, cache_dir=tmp_path)
    assert verdict.reason == LEAKED_MEMORY, verdict.summary()
    assert words in verdict.detail, verdict.detail

