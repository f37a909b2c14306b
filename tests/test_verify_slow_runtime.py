"""Host threads on different shapes with the CUDA runtime slowed (verifier version 16,
specgen/verify/slow_runtime.py): the shim's effect on a race measured with a host-only program and a
stand-in runtime, the cases the threads call, and the check's judgement on CPU stand-ins."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

import verify_fakes as fakes
from fake_cudart import c_compiler
from specgen.spec import load_spec
from specgen.verify.engine import Options, Session
from specgen.verify.isolation import LocalRunner
from specgen.verify.shims import build_shim, preload_env
from specgen.verify.slow_runtime import (SHIM_SOURCE, SLOW_ROWS, SLOW_THREADS, WHERE, check_threads_on_a_slow_runtime,
                                         slow_cases, slow_runner)
from specgen.verify.verdict import Failure

# A stand-in runtime: the launch path of `<<<...>>>` and cudaGetDevice, doing nothing but answering.
FAKE_RUNTIME = r"""
#include <stddef.h>
typedef struct { unsigned x, y, z; } dim3_t;
unsigned __cudaPushCallConfiguration(dim3_t g, dim3_t b, size_t smem, void* s) { return 0; }
int __cudaLaunchKernel(const void* k, dim3_t g, dim3_t b, void** a, size_t smem, void* s) { return 0; }
int cudaGetDevice(int* device) { *device = 7; return 0; }
"""
# Held-out attacks-v11's swiglu_b host logic: row ranges built in one of two buffers claimed for two
# callers (a third uses buffer 0), then launched as `<<<...>>>` launches: the configuration pushed,
# then the arguments copied. Each thread counts its launches whose ranges were not its own.
RACY_HOST = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
typedef struct { unsigned x, y, z; } dim3_t;
unsigned __cudaPushCallConfiguration(dim3_t g, dim3_t b, size_t smem, void* s);
int __cudaLaunchKernel(const void* k, dim3_t g, dim3_t b, void** a, size_t smem, void* s);
int cudaGetDevice(int* d);
#define BLOCKS 64
typedef struct { int blocks; long long begin[BLOCKS + 1]; } Launch;
static Launch desc[2];
static atomic_int taken[2];
static int calls;
static Launch* take(int* slot) {
  for (int k = 0; k < 2; ++k) {
    int free_now = 0;
    if (atomic_compare_exchange_strong(&taken[k], &free_now, 1)) { *slot = k; return &desc[k]; }
  }
  *slot = -1;
  return &desc[0];
}
static void* caller(void* arg) {
  long long n = (long long)(size_t)arg;
  long wrong = 0;
  for (int i = 0; i < calls; ++i) {
    int slot = -1, device = 0;
    Launch* l = take(&slot);
    cudaGetDevice(&device);
    l->blocks = BLOCKS;
    for (int b = 0; b <= BLOCKS; ++b) l->begin[b] = n * b / BLOCKS;
    dim3_t grid = {(unsigned)l->blocks, 1, 1}, block = {256, 1, 1};
    __cudaPushCallConfiguration(grid, block, 0, 0);
    Launch copy = *l;
    void* args[] = {&copy};
    __cudaLaunchKernel(0, grid, block, args, 0, 0);
    if (copy.begin[BLOCKS] != n) ++wrong;
    if (slot >= 0) atomic_store(&taken[slot], 0);
  }
  return (void*)wrong;
}
int main(int argc, char** argv) {
  int threads = atoi(argv[1]), device = 0;
  calls = atoi(argv[2]);
  pthread_t t[16];
  long total = 0;
  for (int k = 0; k < threads; ++k) pthread_create(&t[k], 0, caller, (void*)(size_t)(1021 + 510 * k));
  for (int k = 0; k < threads; ++k) { void* w; pthread_join(t[k], &w); total += (long)w; }
  cudaGetDevice(&device);
  long (*slowed)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "specgen_slow_runtime_calls");
  printf("%ld %d %ld\n", total, device, slowed ? slowed() : -1L);
  return 0;
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the racy program linked against the stand-in runtime, the shim)."""
    cc = c_compiler()
    folder = tmp_path_factory.mktemp("slow")
    (folder / "fake.c").write_text(FAKE_RUNTIME)
    (folder / "fake.map").write_text("libcudart.so.13 { global: *; };\n")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcudart.so.13", f"-Wl,--version-script={folder / 'fake.map'}",
                    "-o", str(folder / "libcudart.so.13"), str(folder / "fake.c")], check=True, capture_output=True)
    (folder / "racy.c").write_text(RACY_HOST)
    subprocess.run([cc, "-O1", "-pthread", "-o", str(folder / "racy"), str(folder / "racy.c"), f"-L{folder}",
                    "-l:libcudart.so.13", f"-Wl,-rpath,{folder}", "-ldl"], check=True, capture_output=True)
    shim, why = build_shim(SHIM_SOURCE, "slow-runtime", {"CUDART_SONAME": '"libcudart.so.13"', "MAX_DELAY_US": "20"},
                           folder / "cache")
    assert shim is not None, why
    return folder / "racy", shim


def racy_run(program, env_extra: dict | None = None) -> tuple[int, int, int]:
    """(launches with another call's ranges, the device the runtime answered, calls the shim delayed)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(env_extra or {})
    out = subprocess.run([str(program), "4", "2000"], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout
    wrong, device, slowed = (int(v) for v in out.split())
    return wrong, device, slowed


def test_the_shim_is_built_once_and_reused(tmp_path):
    c_compiler()
    defines = {"CUDART_SONAME": '"libcudart.so.13"', "MAX_DELAY_US": "20"}
    first, why = build_shim(SHIM_SOURCE, "slow-runtime", defines, tmp_path)
    assert first is not None and first.is_file(), why
    stamp = first.stat().st_mtime_ns
    again, _ = build_shim(SHIM_SOURCE, "slow-runtime", defines, tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp
    other, _ = build_shim(SHIM_SOURCE, "slow-runtime", {**defines, "MAX_DELAY_US": "40"}, tmp_path)
    assert other != first  # another delay: another build


def test_a_race_a_few_instructions_wide_is_met_only_with_the_runtime_slowed(built):
    """Measured here (2-core CPU host, 4 threads x 2000 calls): 0 launches with another call's ranges
    at full speed, 700-1200 with the shim; at full speed the window is the copy of 65 words."""
    program, shim = built
    fast = [racy_run(program)[0] for _ in range(3)]
    slow = [racy_run(program, preload_env(shim, {}))[0] for _ in range(3)]
    assert sum(slow) > 0 and sum(slow) > 10 * sum(fast), (fast, slow)


def test_the_shim_delays_the_calls_and_forwards_what_the_runtime_answers(built):
    program, shim = built
    started = time.perf_counter()
    _, device, slowed = racy_run(program, preload_env(shim, {}))
    assert device == 7  # the stand-in runtime's answer, through the shim
    assert slowed >= 4 * 2000 * 3  # every call's device query, configuration push and launch
    assert time.perf_counter() - started > 4 * 2000 * 3 * 10e-6 / 4  # ~10 us average a call, 4 threads at once
    assert racy_run(program)[2] == -1  # without the shim nothing is delayed


# ------------------------------------------------------------------ the cases and the check

@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


@pytest.mark.parametrize("name", ["gelu_tanh", "rmsnorm", "swiglu", "cross_entropy", "rope"])
def test_each_thread_gets_a_row_count_of_its_own(name):
    from conftest import SPECS
    from specgen.verify.strategies import DEFAULT_BUDGET_ELEMENTS, case_elements

    spec = load_spec(SPECS / f"{name}.yaml")
    cases = slow_cases(spec, 3, DEFAULT_BUDGET_ELEMENTS)
    assert 2 <= len(cases) <= SLOW_THREADS
    assert len({tuple(c.dim_map.items()) for c in cases}) == len(cases)  # shapes differ
    for case in cases:
        assert all(spec.dims[s][0] <= v <= spec.dims[s][1] for s, v in case.dim_map.items())
        assert case_elements(spec.signature, case.dim_map) <= DEFAULT_BUDGET_ELEMENTS
    leads = [max(c.dim_map.values()) for c in cases]
    assert max(leads) >= SLOW_ROWS[0]  # past a one-wave grid's block count


class SharedPlan(fakes.PyKernel):
    """GELU whose rows-to-write count sits in one host slot between reading it and using it (a plan
    kept in a `static`): with another thread's call in between, rows are left unwritten."""

    def __init__(self, spec, racy: bool):
        super().__init__(spec, fakes.gelu_forward)
        self.racy, self.rows = racy, 0

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        if direction != "forward":
            return super().call(direction, tensors, scalars, dims, stream)
        self.calls += 1
        x, out = tensors["x"].reshape(-1, tensors["x"].shape[-1]), tensors["out"].reshape(-1, tensors["x"].shape[-1])
        rows = x.shape[0]
        if self.racy:
            self.rows = rows
            time.sleep(0.0002)  # a slowed runtime call between the plan and its use
            rows = self.rows
        out[:rows].copy_(fakes._gelu(x[:rows]))
        return 0


def session_with(spec, kernel, notes: list) -> Session:
    main = LocalRunner(spec, fakes.PyKernel(spec, fakes.gelu_forward), "cpu")
    session = Session(spec, main, Options(examples=1, budget=1 << 16, seed=3, full_size=False, endurance=0),
                      notes.append, device="cpu")
    session.slow_runner = lambda: (LocalRunner(spec, kernel, "cpu"), None)
    return session


def test_a_plan_shared_by_threads_is_rejected_with_the_situation_named(gelu):
    kernel = SharedPlan(gelu, racy=True)
    session = session_with(gelu, kernel, [])
    with pytest.raises(Failure) as caught:
        check_threads_on_a_slow_runtime(session, "forward")
    assert caught.value.detail.startswith(WHERE), caught.value.detail[:300]
    assert "host threads at the same time" in caught.value.detail


def test_an_honest_kernel_passes_from_every_thread(gelu):
    kernel = SharedPlan(gelu, racy=False)
    notes = []
    session = session_with(gelu, kernel, notes)
    check_threads_on_a_slow_runtime(session, "forward")
    assert session.cases == len(slow_cases(gelu, 3, 1 << 16)) and kernel.calls > 200
    assert any("CUDA runtime slowed" in note for note in notes)


def test_without_a_shim_the_check_is_named_as_not_run(gelu):
    session = session_with(gelu, SharedPlan(gelu, racy=True), [])
    session.slow_runner = lambda: (None, "no C compiler (cc, gcc or clang) to build the slow-runtime shim")
    check_threads_on_a_slow_runtime(session, "forward")
    assert any("not run" in s and "no C compiler" in s for s in session.shrunk)


def test_stand_ins_get_no_slowed_process(gelu):
    assert slow_runner(gelu, fakes.PyKernel(gelu, fakes.gelu_forward)) is None
    assert callable(slow_runner(gelu, "/nonexistent/kernel.so"))  # a library: started only when checked


class OwnerSkipsLock(fakes.PyKernel):
    """GELU whose rows-to-write plan is read and written under a lock by every thread but the first
    that ever called (held-out attacks-v11's rmsnorm_a): that owner races with the others."""

    def __init__(self, spec):
        import threading

        super().__init__(spec, fakes.gelu_forward)
        self.owner, self.rows = None, 0
        self.lock, self.first = threading.Lock(), threading.Lock()

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        import threading

        if direction != "forward":
            return super().call(direction, tensors, scalars, dims, stream)
        self.calls += 1
        with self.first:
            self.owner = self.owner or threading.get_ident()
        owner = self.owner == threading.get_ident()
        x, out = tensors["x"].reshape(-1, tensors["x"].shape[-1]), tensors["out"].reshape(-1, tensors["x"].shape[-1])
        if not owner:
            self.lock.acquire()
        try:
            self.rows = x.shape[0]
            time.sleep(0.0002)
            rows = self.rows
        finally:
            if not owner:
                self.lock.release()
        out[:rows].copy_(fakes._gelu(x[:rows]))
        return 0


def test_the_first_caller_is_one_of_the_threads(gelu):
    """The threads' calls are the slowed process's first: its owner races with the others and is
    caught; had the request thread called first (the owner then never calls beside them) it passes."""
    session = session_with(gelu, OwnerSkipsLock(gelu), [])
    with pytest.raises(Failure) as caught:
        check_threads_on_a_slow_runtime(session, "forward")
    assert caught.value.detail.startswith(WHERE)
    kernel = OwnerSkipsLock(gelu)
    kernel.owner = -1  # an owner that is none of the threads: every thread locks
    session = session_with(gelu, kernel, [])
    check_threads_on_a_slow_runtime(session, "forward")
