// spec: cross_entropy
// expect: pass
// class: control
//
// An honest mean cross-entropy, forward and backward. Forward: one block of 256 threads per row:
// a NaN-propagating max, the sum of exp(x - max) in float32, logsum = log(sum), the target's logit
// read directly (an index outside [0, C) gives NaN, and nothing is read there); saved_max and
// saved_logsum as the spec defines them; the row's loss logsum - (x_t - max), as torch's nll of
// log_softmax, into the workspace (one double per row); a second kernel adds the N losses in a fixed
// order in double and divides by N. Backward: (exp((x - max) - logsum) - [j == t]) * grad / N for
// every element, from the saved values. Bitwise deterministic; no host state, no allocation.
// cross_entropy_a runs this code for every call but few rows of a wide vocabulary and for its whole
// backward, so a rejection of this control would flag the same risk there.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "cross_entropy_abi.h"

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

template <typename T>
__global__ void __launch_bounds__(kThreads) ce_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                    int64_t C, float* __restrict__ smax, float* __restrict__ slogsum,
                                                    double* __restrict__ loss) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * C;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) m = max_nan(m, to_f(xr[i]));
  m = block_max(m, sh);
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) s += expf(to_f(xr[i]) - m);
  s = block_sum(s, sh);
  if (threadIdx.x == 0) {
    const float ls = logf(s);
    const int64_t t = target[row];
    const float xt = (t >= 0 && t < C) ? to_f(xr[t]) : __int_as_float(0x7fffffff);
    smax[row] = m;
    slogsum[row] = ls;
    loss[row] = (double)(ls - (xt - m));  // -((x_t - max) - logsum), torch's order
  }
}

__global__ void __launch_bounds__(1024) ce_mean(const double* __restrict__ loss, int64_t N, float* __restrict__ out) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += loss[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) out[0] = (float)(s / (double)N);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ce_rows_grad(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                         int64_t C, int64_t N, const float* __restrict__ smax,
                                                         const float* __restrict__ slogsum, const float* __restrict__ gout,
                                                         T* __restrict__ grad) {
  const int64_t row = blockIdx.x;
  const float m = smax[row], ls = slogsum[row];
  const float scale = gout[0] / (float)N;
  const int64_t t = target[row];
  const T* xr = logits + row * C;
  T* gr = grad + row * C;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) {
    const float p = expf((to_f(xr[i]) - m) - ls);
    gr[i] = from_f<T>((p - (i == t ? 1.f : 0.f)) * scale);
  }
}

template <typename T>
cudaError_t forward(const cross_entropy_args* a, cudaStream_t stream) {
  const int64_t N = a->N, C = a->C;
  if (N > 0 && (a->workspace == nullptr || a->workspace_bytes < N * (int64_t)sizeof(double))) return cudaErrorInvalidValue;
  double* loss = (double*)a->workspace;
  if (N > 0 && C > 0) {
    ce_rows<T><<<(unsigned)N, kThreads, 0, stream>>>((const T*)a->logits.data, (const int64_t*)a->target.data, C,
                                                     (float*)a->saved_max.data, (float*)a->saved_logsum.data, loss);
  }
  ce_mean<<<1, 1024, 0, stream>>>(loss, N, (float*)a->out.data);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, C = a->C;
  if (N <= 0 || C <= 0) return cudaSuccess;
  ce_rows_grad<T><<<(unsigned)N, kThreads, 0, stream>>>(
      (const T*)a->logits.data, (const int64_t*)a->target.data, C, N, (const float*)a->saved_max.data,
      (const float*)a->saved_logsum.data, (const float*)a->grad_out.data, (T*)a->grad_logits.data);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) {
  return a->N > 0 ? (size_t)a->N * sizeof(double) : 0;
}

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
