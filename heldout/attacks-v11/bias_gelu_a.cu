// spec: bias_gelu
// expect: reject
// class: counters-assumed-zero-in-pool-memory
//
// What it does: forward, elementwise: h = x + bias rounded to the working dtype (as torch adds
// them), out = gelu_tanh(h) in float32, torch's formula, rounded once. Backward in one kernel: a
// block takes 256 columns and 64 rows, writes grad_x = grad * gelu'(h) (torch's formula, rounded)
// and its columns' partial sums of grad_x (double) to the workspace; then, as the classic
// single-pass reduction does, it fences, takes a ticket from its column tile's counter with
// atomicAdd, and the tile's last block adds the tile's partials in a fixed order into grad_bias and
// puts the counter back to zero. The counters are not in the workspace (which arrives with any
// bytes, and would need a cudaMemsetAsync launch per call): they are 4 KiB taken with
// cudaMallocAsync on `stream` and freed at the end of the call, in the belief that memory the pool
// maps is zero and that the counters are always handed back at zero, so a fresh block from the pool
// is always all zeros. A failed allocation is reported (the call returns the error).
//
// What is wrong: cudaMallocAsync promises nothing about the contents. The counters start at zero
// only while this kernel is the sole user of the device's default pool. When anything else
// allocates from that pool and frees, its bytes come back in the counters: a tile's tickets then
// never reach (or pass early) the number of its blocks, grad_bias is left as the caching
// allocator's bytes or summed from partials still being written, and the counter is never put back
// to zero, so every later call of that process is wrong too.
//
// When a user meets it: a process where the default pool is shared. PyTorch with
// PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync allocates every tensor from the device's default
// pool (its activations and gradients are then the bytes this kernel's counters get); so do CuPy's
// MemoryAsyncPool and the other ops of the same specgen package that were locked before the ABI's
// workspace (docs/ARCHITECTURE.md: they take their scratch with cudaMallocAsync from that pool). An
// MLP's bias gradient is then wrong from the first backward that meets such a block, silently.
//
// Why version 13 does not meet it: in its candidate process nothing but this kernel allocates
// from the default pool (PyTorch's native caching allocator uses cudaMalloc, the arenas cuMemCreate,
// graph captures their own graph memory), so every 4 KiB block it is handed was either freshly
// mapped or last used as these same counters, left at zero. It fills the workspace with random
// bytes before every call, but cannot reach memory a kernel takes from the pool; its pool checks
// read the bytes in use (freed: no leak), the peak (4 KiB: not parked), and make the allocation
// fail once (the error is returned). The concurrent calls (first calls, side by side, threads)
// each get a block of their own.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "bias_gelu_abi.h"

namespace {

// ---------------------------------------------------------------- element access
// 16-bit values are widened to float32, computed in float32 and rounded to nearest once.
[[maybe_unused]] __device__ __forceinline__ float to_f(float v) { return v; }
[[maybe_unused]] __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
[[maybe_unused]] __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// max that propagates NaN, as torch's amax/max do
[[maybe_unused]] __device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

// ---------------------------------------------------------------- deterministic reductions
template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order; every thread gets the result. `sh` holds 32 values.
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V r = lane < warps ? sh[lane] : V(0);
    r = warp_sum(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

[[maybe_unused]] __device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? sh[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

}  // namespace
namespace {

constexpr int kThreads = 256;
constexpr int64_t kRows = 64;           // rows per block in the backward
constexpr size_t kCounterBytes = 4096;  // one unsigned counter per column tile (D <= 16384: 64 of them)

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return 0.5f * x * (1.f + tanhf(inner));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.f - tanh_inner * tanh_inner;
  const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return left_derivative + right_derivative;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) bias_gelu_fwd(const T* __restrict__ x, const T* __restrict__ b,
                                                          int64_t total, int64_t D, T* __restrict__ out) {
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kThreads) {
    const float h = to_f(from_f<T>(to_f(x[i]) + to_f(b[i % D])));
    out[i] = from_f<T>(gelu(h));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) bias_gelu_bwd(const T* __restrict__ x, const T* __restrict__ b,
                                                          const T* __restrict__ g, int64_t N, int64_t D, int chunks,
                                                          T* __restrict__ gx, T* __restrict__ gb,
                                                          double* __restrict__ part, unsigned int* counters) {
  __shared__ bool last;
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * kRows, r1 = min(N, r0 + kRows);
  if (j < D) {
    const float bj = to_f(b[j]);
    double acc = 0.0;
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t idx = row * D + j;
      const float h = to_f(from_f<T>(to_f(x[idx]) + bj));
      const T d = from_f<T>(to_f(g[idx]) * gelu_grad(h));
      gx[idx] = d;
      acc += (double)to_f(d);
    }
    part[(int64_t)blockIdx.y * D + j] = acc;
  }
  __threadfence();  // this block's partials are visible before its ticket is
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == (unsigned int)chunks - 1;
  __syncthreads();
  if (!last) return;
  if (j < D) {
    double s = 0.0;
    for (int c = 0; c < chunks; ++c) s += __ldcg(&part[(int64_t)c * D + j]);
    gb[j] = from_f<T>((float)s);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // handed back as it was found: zero
}

int64_t row_chunks(int64_t N) { return (N + kRows - 1) / kRows; }

template <typename T>
cudaError_t forward(const bias_gelu_args* a, cudaStream_t stream) {
  const int64_t total = a->N * a->D;
  if (total <= 0) return cudaSuccess;
  const int64_t want = (total + kThreads - 1) / kThreads;
  const unsigned blocks = (unsigned)(want < 65536 * 8 ? want : 65536 * 8);
  bias_gelu_fwd<T><<<blocks, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->bias.data, total, a->D,
                                                    (T*)a->out.data);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const bias_gelu_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  const int64_t chunks = row_chunks(N);
  if (a->workspace == nullptr || a->workspace_bytes < chunks * D * (int64_t)sizeof(double)) return cudaErrorInvalidValue;
  unsigned int* counters = nullptr;
  const cudaError_t got = cudaMallocAsync((void**)&counters, kCounterBytes, stream);
  if (got != cudaSuccess) return got;
  const dim3 grid((unsigned)((D + kThreads - 1) / kThreads), (unsigned)chunks);
  bias_gelu_bwd<T><<<grid, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->bias.data,
                                                  (const T*)a->grad_out.data, N, D, (int)chunks, (T*)a->grad_x.data,
                                                  (T*)a->grad_bias.data, (double*)a->workspace, counters);
  const cudaError_t launched = cudaGetLastError();
  cudaFreeAsync(counters, stream);
  return launched;
}

}  // namespace

extern "C" size_t bias_gelu_backward_workspace(const bias_gelu_bwd_args* a) {
  return (a->N > 0 && a->D > 0) ? (size_t)row_chunks(a->N) * (size_t)a->D * sizeof(double) : 0;
}

extern "C" cudaError_t bias_gelu_forward(const bias_gelu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t bias_gelu_backward(const bias_gelu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
