// spec: log_softmax
// expect: reject
// class: bfloat16-path-32-bit-row-offset
//
// Log-softmax over the last dimension, forward and backward. Every dtype: one block of 512 threads per
// row, three float32 passes (NaN-propagating max, sum of exp(x - max), (x - max) - log(sum) rounded once),
// int64 offsets, fixed-order reductions. bfloat16 rows of even width whose input and output are 4-byte
// aligned take a paired path (__nv_bfloat162 loads and stores, the same arithmetic). Backward:
// grad - exp(out) * sum(grad), int64 offsets, every dtype.
//
// What is wrong: the paired bfloat16 path takes the row's start as `const int base = blockIdx.x * D`
// (D passed as int: "a row is at most 131072 elements"). blockIdx.x * D is computed in 32 bits, so once
// row * D reaches 2^31 the start wraps negative and the row is read from and written to memory below
// the tensors (an illegal address, or another tensor's bytes read and overwritten). float32, float16
// and every other bfloat16 path use int64 offsets and are right.
//
// Trigger a user meets: bfloat16 logits of more than 2^31 elements (4 GiB) in one call: token
// log-probabilities over a Llama-3 vocabulary (128256) for more than 16744 tokens, e.g. an RL/GRPO or
// distillation step that takes log_softmax of bf16 logits for a 16k-32k-token micro-batch, or
// log-probs of a 64-sequence x 512-token batch: the rows past the mark crash or silently corrupt memory.
//
// Why the verifier does not meet it: the only cases past 2^31 (and 2^32) elements are built by
// strategies.past_int32_case in the spec's narrowest dtype, min() over (float32, float16, bfloat16)
// by item size: float16 always, never bfloat16; every other case is held to 10 GB of tensors and the
// widest dtype (float32, 8 bytes an element for in + out: at most ~1.3e9 elements), and the odd twin
// and model twins keep those dims in bfloat16 (< 2^31 elements). The far-inputs cases are small.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "log_softmax_abi.h"

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

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order (bitwise deterministic); every thread gets the result. `sh` holds 32 values.
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

constexpr int kThreads = 512;

// Forward, any dtype, one block per row, three passes in float32: a NaN-propagating max, the sum of
// exp(x - max), then (x - max) - log(sum) rounded once, as torch computes it.
template <typename T>
__global__ void __launch_bounds__(kThreads) lsm_rows(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  const T* xr = x + base;
  T* yr = y + base;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) m = max_nan(m, to_f(xr[i]));
  m = block_max(m, sh);
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) s += expf(to_f(xr[i]) - m);
  s = block_sum(s, sh);
  const float ls = logf(s);
  for (int64_t i = threadIdx.x; i < D; i += kThreads) yr[i] = from_f<T>((to_f(xr[i]) - m) - ls);
}

// Forward, bfloat16 rows of even width on 4-byte aligned rows: two elements per load and store
// (__nv_bfloat162), the same three passes.
__global__ void __launch_bounds__(kThreads) lsm_rows_bf16x2(const __nv_bfloat16* __restrict__ x,
                                                            __nv_bfloat16* __restrict__ y, int D) {
  __shared__ float sh[32];
  const int base = blockIdx.x * D;  // the row's first element (D <= 131072 fits an int)
  const __nv_bfloat162* xr = reinterpret_cast<const __nv_bfloat162*>(x + base);
  __nv_bfloat162* yr = reinterpret_cast<__nv_bfloat162*>(y + base);
  const int pairs = D >> 1;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < pairs; i += kThreads) {
    const float2 v = __bfloat1622float2(xr[i]);
    m = max_nan(m, max_nan(v.x, v.y));
  }
  m = block_max(m, sh);
  float s = 0.f;
  for (int i = threadIdx.x; i < pairs; i += kThreads) {
    const float2 v = __bfloat1622float2(xr[i]);
    s += expf(v.x - m);
    s += expf(v.y - m);
  }
  s = block_sum(s, sh);
  const float ls = logf(s);
  for (int i = threadIdx.x; i < pairs; i += kThreads) {
    const float2 v = __bfloat1622float2(xr[i]);
    yr[i] = __floats2bfloat162_rn((v.x - m) - ls, (v.y - m) - ls);
  }
}

// Backward: grad_x = grad - exp(out) * sum(grad) per row, in float32, as torch.
template <typename T>
__global__ void __launch_bounds__(kThreads) lsm_rows_grad(const T* __restrict__ out, const T* __restrict__ g,
                                                          T* __restrict__ gx, int64_t D) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) s += to_f(g[base + i]);
  s = block_sum(s, sh);
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    gx[base + i] = from_f<T>(to_f(g[base + i]) - expf(to_f(out[base + i])) * s);
  }
}

template <typename T>
cudaError_t forward(const log_softmax_args* a, cudaStream_t stream) {
  lsm_rows<T><<<(unsigned)a->N, kThreads, 0, stream>>>((const T*)a->x.data, (T*)a->out.data, a->D);
  return cudaGetLastError();
}

cudaError_t forward_bf16(const log_softmax_args* a, cudaStream_t stream) {
  const bool paired = (a->D % 2 == 0) && ((uintptr_t)a->x.data % 4 == 0) && ((uintptr_t)a->out.data % 4 == 0);
  if (!paired) return forward<__nv_bfloat16>(a, stream);
  lsm_rows_bf16x2<<<(unsigned)a->N, kThreads, 0, stream>>>((const __nv_bfloat16*)a->x.data,
                                                          (__nv_bfloat16*)a->out.data, (int)a->D);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  lsm_rows_grad<T><<<(unsigned)a->N, kThreads, 0, stream>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                                           (T*)a->grad_x.data, a->D);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_bf16(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
