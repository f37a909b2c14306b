// spec: softmax
// expect: pass
// class: control
//
// An honest softmax, forward and backward. One block of 512 threads per row, three passes over
// the row in float32: a NaN-propagating max, the sum of exp(x - max), then exp(x - max) / sum;
// fixed-order block reductions (bitwise deterministic), int64 offsets, every dtype computed in
// float32 and rounded to nearest once. Backward: out * (grad - sum(grad * out)) per row, as torch.
// No host state, no workspace, no allocation; everything on `stream`. softmax_a runs this code for
// rows of at most 32768 elements and for its whole backward, so a rejection of this control would
// flag the same risk there.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "softmax_abi.h"

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

constexpr int kThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
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
  for (int64_t i = threadIdx.x; i < D; i += kThreads) yr[i] = from_f<T>(expf(to_f(xr[i]) - m) / s);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_rows_grad(const T* __restrict__ out, const T* __restrict__ g,
                                                              T* __restrict__ gx, int64_t D) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  float dot = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) dot += to_f(g[base + i]) * to_f(out[base + i]);
  dot = block_sum(dot, sh);
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    gx[base + i] = from_f<T>(to_f(out[base + i]) * (to_f(g[base + i]) - dot));
  }
}

template <typename T>
cudaError_t forward(const softmax_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  softmax_rows<T><<<(unsigned)a->N, kThreads, 0, stream>>>((const T*)a->x.data, (T*)a->out.data, a->D);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const softmax_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  softmax_rows_grad<T><<<(unsigned)a->N, kThreads, 0, stream>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                                               (T*)a->grad_x.data, a->D);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
