"""Memory outside the workspace, refused before anything runs: module-scope device memory
(`__device__`/`__managed__` variables, ptxas's `bytes gmem`) above checks.MODULE_MEMORY_LIMIT, and
the host allocation calls whose memory outlives a call (cudaMalloc, cudaFree and friends;
cudaMallocAsync/cudaFreeAsync on `stream` stay allowed). The CPU tests call the check itself; the
nvcc tests compile small kernels for sm_90 and run the verifier's static checks (no GPU)."""
from __future__ import annotations

import pytest

from specgen.spec import load_spec
from specgen.verify import static_checks
from specgen.verify.checks import MODULE_MEMORY_LIMIT, check_module_memory
from specgen.verify.verdict import FORBIDDEN_SYMBOL, Failure

ARCH = "sm_90"

SPEC = """\
name: scale
description: Multiply by alpha.
signature: "scale(x: Tensor[N, D], alpha: float = 2.0) -> Tensor[N, D]"
dtypes: [float32]
dims: {N: [1, 64], D: [1, 64]}
reference: |
  def reference(x, alpha=2.0):
      return x * alpha
"""

KERNEL = """\
#include <cuda_runtime.h>
#include "scale_abi.h"
%(globals)s
__global__ void scale_kernel(const float* x, float* y, double alpha, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = (float)(x[i] * alpha) %(use)s;
}
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  long n = a->N * a->D;
  %(calls)s
  scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((const float*)a->x.data, (float*)a->out.data,
                                                                a->alpha, n);
  return cudaGetLastError();
}
"""


def kernel(globals_: str = "", use: str = "", calls: str = "") -> str:
    return KERNEL % {"globals": globals_, "use": use, "calls": calls}


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "scale.yaml"
    path.write_text(SPEC)
    return load_spec(path)


# ------------------------------------------------------------------ the check (CPU)

@pytest.mark.parametrize("size", [None, 0, 8, 4096, MODULE_MEMORY_LIMIT])
def test_no_or_little_module_memory_passes(size):
    check_module_memory(size, "k.cu")


def test_the_bound_lets_small_tables_through_and_refuses_dim_sized_scratch():
    assert 4096 * 4 <= MODULE_MEMORY_LIMIT < 65536  # a 4096-float table; a float row of D = 16384


@pytest.mark.parametrize("size", [MODULE_MEMORY_LIMIT + 1, 65536, 262144, 16777216])
def test_module_memory_above_the_bound_is_refused(size, spec):
    with pytest.raises(Failure) as raised:
        check_module_memory(size, "kernels/scale.cu", spec)
    failure = raised.value
    assert failure.reason == FORBIDDEN_SYMBOL
    detail = failure.detail
    assert detail.startswith(f"kernels/scale.cu defines {size} bytes of module-scope device memory")
    assert f"{size} bytes gmem" in detail and f"more than the {MODULE_MEMORY_LIMIT} bytes" in detail
    assert "shared by concurrent calls, devices and graph replays" in detail
    assert "workspace the ABI hands the kernel" in detail and "`scale_forward_workspace`" in detail
    assert "__constant__" in detail


# ------------------------------------------------------------------ the static checks (nvcc)

@pytest.mark.nvcc
def test_a_small_device_const_table_passes(spec, tmp_path):
    source = kernel("__device__ const float table[1024] = {1.0f, 0.5f};  // 4096 bytes gmem",
                    "* table[i % 1024]")
    verdict, compiled = static_checks(spec, source, arch=ARCH, cache_dir=tmp_path)
    assert verdict is None, verdict.summary()
    assert compiled.module_memory_bytes == 4096


@pytest.mark.nvcc
def test_no_module_memory_passes(spec, tmp_path):
    verdict, compiled = static_checks(spec, kernel(), arch=ARCH, cache_dir=tmp_path)
    assert verdict is None, verdict.summary()
    assert compiled.module_memory_bytes == 0


@pytest.mark.nvcc
@pytest.mark.parametrize("declaration, name, size", [
    ("__device__ float scratch[65536];", "scratch", 262144),
    ("__device__ float2 stats[2][65536];", "stats", 1048576),
    ("__managed__ float scratch[65536];", "scratch", 262144),
    # read-only, but past the bound all the same: a table that large belongs in __constant__ (64 KiB)
    ("__device__ const float table[16384] = {1.0f};", "table", 65536),
])
def test_module_scratch_above_the_bound_is_refused_before_it_runs(spec, tmp_path, declaration, name, size):
    use = f"+ 0.0f * ((const float*){name})[i]"
    verdict, compiled = static_checks(spec, kernel(declaration, use), arch=ARCH, cache_dir=tmp_path)
    assert verdict is not None and verdict.reason == FORBIDDEN_SYMBOL, verdict and verdict.summary()
    assert f"defines {size} bytes of module-scope device memory" in verdict.detail
    assert verdict.detail.startswith("scale.cu ")  # source text: named after the spec
    assert compiled.module_memory_bytes == size


@pytest.mark.nvcc
def test_a_kernel_file_is_named_in_the_refusal(spec, tmp_path):
    path = tmp_path / "cheat.cu"
    path.write_text(kernel("__device__ float scratch[65536];", "+ 0.0f * scratch[i]"))
    verdict, _ = static_checks(spec, path, arch=ARCH, cache_dir=tmp_path / "cache")
    assert verdict.reason == FORBIDDEN_SYMBOL and verdict.detail.startswith(f"{path} defines 262144 bytes")


@pytest.mark.nvcc
def test_a_cudamalloced_table_is_refused(spec, tmp_path):
    globals_ = "static float* g_table = nullptr;"
    calls = "if (!g_table && cudaMalloc(&g_table, 4096) != cudaSuccess) return cudaErrorMemoryAllocation;"
    verdict, compiled = static_checks(spec, kernel(globals_, "", calls), arch=ARCH, cache_dir=tmp_path)
    assert verdict is not None and verdict.reason == FORBIDDEN_SYMBOL, verdict and verdict.summary()
    assert "cudaMalloc@" in verdict.detail and "outlives the call" in verdict.detail
    assert compiled.module_memory_bytes == 0  # refused by its symbol, not its module memory


@pytest.mark.nvcc
def test_stream_ordered_allocation_in_a_call_stays_allowed(spec, tmp_path):
    calls = ("float* tmp = nullptr;\n"
             "  if (cudaMallocAsync((void**)&tmp, 4096, stream) != cudaSuccess) return cudaErrorMemoryAllocation;\n"
             "  cudaFreeAsync(tmp, stream);")
    verdict, _ = static_checks(spec, kernel("", "", calls), arch=ARCH, cache_dir=tmp_path)
    assert verdict is None, verdict.summary()
