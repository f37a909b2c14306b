// spec: rmsnorm
// expect: pass
// class: control
//
// An honest RMSNorm, forward and backward. Forward: one block of 256 threads per row, the sum of squares
// in float32, rstd = rsqrt(sum / D + eps) (saved_rstd), out = (x * rstd) * weight rounded once. Backward:
// grad_x = rstd * (g * w) - x * rstd^3 * mean(g * w * x), a block per row; grad_weight from double
// column partials of g * x * rstd over 128-row chunks (the workspace), added in a fixed order by a third
// kernel. Bitwise deterministic, int64 offsets, no host state. rmsnorm_a is this file at every size below
// 2^23 elements (and its forward everywhere), so a rejection of this control flags the same risk there.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "rmsnorm_abi.h"

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

constexpr int kThreads = 256;
constexpr int kChunk = 128;  // rows per weight-gradient partial

// ---------------------------------------------------------------- forward: one block per row
template <typename T>
__global__ void __launch_bounds__(kThreads) rms_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                                    float* __restrict__ rstd_out, int64_t D, float eps) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float v = to_f(x[base + i]);
    ss += v * v;
  }
  ss = block_sum(ss, sh);
  const float r = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = r;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) y[base + i] = from_f<T>((to_f(x[base + i]) * r) * to_f(w[i]));
}

// grad_x of one row: r * (g w) - x r^3 mean(g w x), in float32
template <typename T>
__device__ __forceinline__ void row_grad_x(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g,
                                           T* __restrict__ gx, int64_t base, int64_t D, float r, float* sh) {
  float dot = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) dot += to_f(g[base + i]) * to_f(w[i]) * to_f(x[base + i]);
  dot = block_sum(dot, sh);
  const float c = r * r * r * dot / (float)D;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    gx[base + i] = from_f<T>(r * (to_f(g[base + i]) * to_f(w[i])) - to_f(x[base + i]) * c);
  }
}

// ---------------------------------------------------------------- backward, three kernels
template <typename T>
__global__ void __launch_bounds__(kThreads) rms_bwd_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                         const float* __restrict__ rstd, const T* __restrict__ g,
                                                         T* __restrict__ gx, int64_t D) {
  __shared__ float sh[32];
  row_grad_x(x, w, g, gx, (int64_t)blockIdx.x * D, D, rstd[blockIdx.x], sh);
}

// column partials of sum(g * x * rstd) over a chunk of kChunk rows, in double
template <typename T>
__global__ void __launch_bounds__(kThreads) rms_bwd_wpart(const T* __restrict__ x, const float* __restrict__ rstd,
                                                          const T* __restrict__ g, double* __restrict__ part,
                                                          int64_t N, int64_t D) {
  const int64_t c = (int64_t)blockIdx.y * kThreads + threadIdx.x;
  if (c >= D) return;
  const int64_t r0 = (int64_t)blockIdx.x * kChunk, r1 = r0 + kChunk < N ? r0 + kChunk : N;
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) acc += (double)to_f(g[r * D + c]) * (double)(to_f(x[r * D + c]) * rstd[r]);
  part[(int64_t)blockIdx.x * D + c] = acc;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) rms_bwd_wsum(const double* __restrict__ part, T* __restrict__ gw,
                                                         int64_t parts, int64_t D) {
  const int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (c >= D) return;
  double acc = 0.0;
  for (int64_t k = 0; k < parts; ++k) acc += part[k * D + c];
  gw[c] = from_f<T>((float)acc);
}

int64_t chunks(int64_t N) { return (N + kChunk - 1) / kChunk; }



template <typename T>
cudaError_t forward(const rmsnorm_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  rms_fwd<T><<<(unsigned)a->N, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data, (T*)a->out.data,
                                                     (float*)a->saved_rstd.data, a->D, (float)a->eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;

  const int64_t parts = chunks(N);
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < (size_t)(parts * D) * sizeof(double)) {
    return cudaErrorInvalidValue;
  }
  double* part = (double*)a->workspace;
  rms_bwd_rows<T><<<(unsigned)N, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                        (const float*)a->saved_rstd.data, (const T*)a->grad_out.data,
                                                        (T*)a->grad_x.data, D);
  const dim3 grid((unsigned)parts, (unsigned)((D + kThreads - 1) / kThreads));
  rms_bwd_wpart<T><<<grid, kThreads, 0, stream>>>((const T*)a->x.data, (const float*)a->saved_rstd.data,
                                                  (const T*)a->grad_out.data, part, N, D);
  rms_bwd_wsum<T><<<(unsigned)((D + kThreads - 1) / kThreads), kThreads, 0, stream>>>(part, (T*)a->grad_weight.data,
                                                                                      parts, D);
  return cudaGetLastError();
}

template <typename F>
cudaError_t dispatch(int32_t dtype, F&& f) {
  switch (dtype) {
    case SPECGEN_FLOAT32: return f(float{});
    case SPECGEN_FLOAT16: return f(__half{});
    case SPECGEN_BFLOAT16: return f(__nv_bfloat16{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" size_t rmsnorm_backward_workspace(const rmsnorm_bwd_args* a) {
  if (a->N <= 0 || a->D <= 0) return 0;

  return (size_t)(chunks(a->N) * a->D) * sizeof(double);
}

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  return dispatch(a->x.dtype, [&](auto t) { return forward<decltype(t)>(a, stream); });
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  return dispatch(a->x.dtype, [&](auto t) { return backward<decltype(t)>(a, stream); });
}
