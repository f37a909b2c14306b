"""Optional setup refused, as under MPS (verifier version 16, specgen/verify/refused_setup.py): the
LD_PRELOAD shim refuses cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize) through the real runtime
(so the runtime returns and records the error) and forwards every other limit; the check runs a
candidate's first calls where the set-aside is refused. Host-only here: the shim against a C
stand-in runtime and against the toolkit's libcudart (which fails without a GPU, but its versioned
symbol is interposed on all the same), and the check with Python stand-ins; the end-to-end run on a
GPU is marked `gpu`."""
from __future__ import annotations

import os
import subprocess

import pytest

import verify_fakes as fakes
from fake_cudart import build_fake_runtime, build_program, c_compiler
from specgen.spec import load_spec
from specgen.verify import refused_setup
from specgen.verify.engine import Options, Session
from specgen.verify.isolation import LocalRunner
from specgen.verify.refused_setup import (PERSISTING_L2, WHERE, check_refused_setup, preload_env, refused_runner,
                                          shim_library)
from specgen.verify.verdict import CUDA_ERROR, WRONG_RESULT, Failure

PROGRAM = r"""
#include <stdio.h>
#include <stddef.h>
#include <dlfcn.h>
int cudaDeviceSetLimit(int limit, size_t value);
int cudaGetLastError(void);
int cudaPeekAtLastError(void);
%(hooks)s
int main(void) {
  int refused = cudaDeviceSetLimit(6, 1 << 20);   /* cudaLimitPersistingL2CacheSize */
  int pending = cudaPeekAtLastError();
  int seen = %(seen)s;
  int cleared = cudaGetLastError();
  int after = cudaPeekAtLastError();
  int stack = cudaDeviceSetLimit(0, 4096);        /* cudaLimitStackSize: not intercepted */
  long (*calls)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "specgen_refused_setup_calls");
  printf("%%d %%d %%d %%d %%d %%d %%d %%ld\n", refused, pending, seen, cleared, after, stack, %(last)s,
         calls ? calls() : -1L);
  return 0;
}
"""
FAKE_HOOKS = "int fake_last_limit(void); size_t fake_last_value(void);"


def run(program, env_extra: dict | None = None) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(env_extra or {})
    out = subprocess.run([str(program)], capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    return [int(v) for v in out.split()]


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    c_compiler()
    path, why = shim_library(cache_dir=tmp_path_factory.mktemp("cache"))
    assert path is not None, why
    return path


def test_the_shim_builds_and_is_cached_by_content(tmp_path):
    c_compiler()
    first, why = shim_library(cache_dir=tmp_path)
    assert first is not None and first.is_file(), why
    stamp = first.stat().st_mtime_ns
    again, _ = shim_library(cache_dir=tmp_path)
    assert again == first and first.stat().st_mtime_ns == stamp  # reused, not rebuilt
    other, _ = shim_library("libcudart.so.12", cache_dir=tmp_path)
    assert other is not None and other != first  # another runtime's soname: another build
    exported = subprocess.run(["nm", "-D", "--defined-only", str(first)], capture_output=True, text=True).stdout
    assert " cudaDeviceSetLimit" in exported and "specgen_refused_setup_calls" in exported


def test_the_shim_refuses_the_set_aside_through_the_runtime(shim, tmp_path):
    """Against a stand-in runtime with libcudart.so.13's soname and symbol version: the set-aside
    comes back refused and the runtime itself holds the error (cudaGetLastError returns and clears
    it); the shim asked the runtime for a limit no device has; the stack limit reaches the runtime
    untouched. Without the shim the set-aside is granted."""
    runtime = build_fake_runtime(tmp_path / "rt")
    program = build_program(tmp_path, PROGRAM % {"hooks": FAKE_HOOKS, "seen": "fake_last_limit()",
                                                 "last": "fake_last_limit()"}, runtime.parent)
    refused, pending, seen, cleared, after, stack, last, calls = run(program, preload_env(shim, {}))
    assert (refused, pending, cleared, after) == (215, 215, 215, 0)  # cudaErrorUnsupportedLimit, recorded
    assert seen not in (PERSISTING_L2, -1) and seen > 10  # the real function got a limit no device has
    assert (stack, last, calls) == (0, 0, 1)  # the stack limit forwarded as given; one refusal counted
    granted, pending, seen, cleared, after, stack, last, calls = run(program)
    assert (granted, pending, seen, cleared, calls) == (0, 0, PERSISTING_L2, 0, -1)


def test_the_shim_interposes_on_the_toolkits_versioned_symbol(shim, tmp_path):
    """Linked against the toolkit's libcudart (cudaDeviceSetLimit@libcudart.so.13, as every
    candidate is): the preloaded shim gets the set-aside call and forwards the stack limit. Without
    a GPU the runtime fails both (no driver), so the proof is the shim's own count."""
    from specgen.toolchain import find_cuda_toolkit

    try:
        toolkit = find_cuda_toolkit()
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"no CUDA toolkit: {error}")
    program = build_program(tmp_path, PROGRAM % {"hooks": "", "seen": "0", "last": "0"}, toolkit.cudart.parent)
    refused, pending, _, cleared, _, _, _, calls = run(program, preload_env(shim, {}))
    assert calls == 1  # only the set-aside was intercepted, the stack limit went to the runtime
    assert refused != 0 and pending == refused and cleared == refused  # the runtime's own error, recorded
    assert run(program)[-1] == -1  # no shim: nothing counted


def test_preloading_keeps_what_the_environment_preloads(tmp_path):
    assert preload_env(tmp_path / "s.so", {"LD_PRELOAD": "/opt/x.so"}) == {"LD_PRELOAD": f"{tmp_path}/s.so:/opt/x.so"}
    assert preload_env(tmp_path / "s.so", {}) == {"LD_PRELOAD": f"{tmp_path}/s.so"}


def test_the_check_runs_only_for_a_library_that_sets_a_limit(tmp_path):
    """A stand-in, or a library that never imports cudaDeviceSetLimit, gets no extra process."""
    cc = c_compiler()
    for name, body in (("sets", "int cudaDeviceSetLimit(int, unsigned long);\n"
                                "int k(void) { return cudaDeviceSetLimit(6, 1); }\n"),
                       ("plain", "int k(void) { return 0; }\n")):
        (tmp_path / f"{name}.c").write_text(body)
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / f"{name}.so"), str(tmp_path / f"{name}.c")],
                       check=True)
    assert refused_setup.imports_set_limit(tmp_path / "sets.so")
    assert callable(refused_runner(None, tmp_path / "sets.so"))
    assert refused_runner(None, tmp_path / "plain.so") is None
    assert refused_runner(None, object()) is None


# ------------------------------------------------------------------ the check, with Python stand-ins

class SetAsideKernel(fakes.PyKernel):
    """GELU whose first call sets aside persisting L2. `refused`: the set-aside fails here (the shim's
    process). What it does then, `on_refusal`: "clears" the error (honest), "leaves" it pending and
    returns success (attacks-v11's rope_a), "returns" it, or "wrong": computes garbage without the window."""

    def __init__(self, spec, *, refused: bool, on_refusal: str):
        super().__init__(spec, fakes.gelu_forward)
        self.refused, self.on_refusal = refused, on_refusal
        self.set_up, self.pending = False, None

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        if not self.set_up:
            self.set_up = True
            if self.refused:
                if self.on_refusal == "returns":
                    return 215
                if self.on_refusal == "leaves":
                    self.pending = {"code": 215, "error": "cudaErrorUnsupportedLimit", "direction": direction}
        code = super().call(direction, tensors, scalars, dims, stream)
        if self.refused and self.on_refusal == "wrong":
            tensors["out"].fill_(0.5)
        return code

    def take_pending(self):
        pending, self.pending = self.pending, None
        return pending

    def error_name(self, code: int) -> str:
        return {215: "cudaErrorUnsupportedLimit"}.get(code, super().error_name(code))


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


def session_with_refusal(spec, on_refusal: str, notes: list) -> tuple[Session, list]:
    started = []

    def start():
        kernel = SetAsideKernel(spec, refused=True, on_refusal=on_refusal)
        started.append(kernel)
        return LocalRunner(spec, kernel, "cpu"), None

    main = LocalRunner(spec, SetAsideKernel(spec, refused=False, on_refusal=on_refusal), "cpu")
    session = Session(spec, main, Options(examples=1, budget=1 << 13, seed=3, full_size=False, endurance=0),
                      notes.append, device="cpu")
    session.refused_runner = start
    return session, started


def test_an_honest_kernel_that_clears_the_refusal_passes(gelu):
    notes = []
    session, started = session_with_refusal(gelu, "clears", notes)
    check_refused_setup(session, "forward")
    assert started and started[0].calls == 5  # its first call, the smoke case twice, one boundary case twice
    assert session.cases == 2 and any("set-aside is refused" in note for note in notes)


def test_an_error_left_pending_where_refused_is_rejected(gelu):
    session, _ = session_with_refusal(gelu, "leaves", [])
    with pytest.raises(Failure) as caught:
        check_refused_setup(session, "forward")
    assert caught.value.reason == CUDA_ERROR
    detail = caught.value.detail
    assert detail.startswith(WHERE) and "returned success but left cudaErrorUnsupportedLimit pending" in detail
    assert "C10_CUDA_KERNEL_LAUNCH_CHECK" in detail and "cudaGetLastError, or return them" in detail


def test_a_kernel_that_returns_the_refusal_is_accepted(gelu):
    notes = []
    session, started = session_with_refusal(gelu, "returns", notes)
    check_refused_setup(session, "forward")
    assert started[0].calls == 0 and any("returned cudaErrorUnsupportedLimit (215)" in n for n in notes)


def test_wrong_outputs_where_refused_are_rejected(gelu):
    session, _ = session_with_refusal(gelu, "wrong", [])
    with pytest.raises(Failure) as caught:
        check_refused_setup(session, "forward")
    assert caught.value.reason == WRONG_RESULT and caught.value.detail.startswith(WHERE)
    assert "its first call: " in caught.value.detail


def test_no_shim_is_noted_not_failed(gelu):
    notes = []
    session, _ = session_with_refusal(gelu, "leaves", notes)
    session.refused_runner = lambda: (None, "no C compiler (cc, gcc or clang) to build the shim")
    check_refused_setup(session, "forward")
    assert any("not run" in s and "no C compiler" in s for s in session.shrunk)


# ------------------------------------------------------------------ on a GPU

ROPE_LIKE = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gelu_tanh_abi.h"
__device__ float f(float v) { return v; }
__device__ float f(__half v) { return __half2float(v); }
__device__ float f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ T to(float v);
template <> __device__ float to<float>(float v) { return v; }
template <> __device__ __half to<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <typename T> __global__ void k(const T* x, T* y, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) { float v = f(x[i]); y[i] = to<T>(0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))); }
}
template <typename T> static void go(const gelu_tanh_args* a, long n, cudaStream_t s) {
  k<T><<<(unsigned)((n + 255) / 256), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n);
}
static int set_up = 0;
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  if (!set_up) { set_up = 1; cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20); %(clear)s }
  const long n = (long)(a->N * a->D);
  if (n == 0) return cudaSuccess;
  if (a->x.dtype == SPECGEN_FLOAT32) go<float>(a, n, stream);
  else if (a->x.dtype == SPECGEN_FLOAT16) go<__half>(a, n, stream);
  else go<__nv_bfloat16>(a, n, stream);
  return cudaSuccess;  // the launch unchecked: a refusal left pending stays pending (returning
                       // cudaGetLastError() would hand the refusal to the caller, which is accepted)
}
// the spec has a backward, so the library must export it; the check runs the forward alone
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  return cudaErrorNotSupported;
}
"""


@pytest.mark.gpu
def test_on_a_gpu_an_unread_refusal_is_caught_where_refused(gelu, tmp_path):
    """A rope_a-like first-call set-aside whose refusal is never read: the process with the shim
    rejects it, the one that clears the error passes (float32 only; not yet run on a GPU)."""
    from host_only_kernels import compiled_library

    spec = load_spec(gelu.path)
    for clear, expect in (("", CUDA_ERROR), ("(void)cudaGetLastError();", None)):
        library = compiled_library(spec, ROPE_LIKE % {"clear": clear}, tmp_path / (clear and "clears" or "leaves"))
        session = Session(spec, None, Options(examples=1, seed=3, full_size=False, endurance=0), lambda s: None)
        session.refused_runner = refused_runner(spec, library)
        assert session.refused_runner is not None
        if expect is None:
            check_refused_setup(session, "forward")
            continue
        with pytest.raises(Failure) as caught:
            check_refused_setup(session, "forward")
        assert caught.value.reason == expect and "left cudaErrorUnsupportedLimit pending" in caught.value.detail
