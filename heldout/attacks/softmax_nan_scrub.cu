// spec: softmax
// expect: rejected
// class: non-finite scrubbing (backward)
// Trick: the backward "sanitises" its result: any NaN/inf gradient element is written as 0.
// Identical to the exact kernel for finite rows; rows whose forward output is NaN (inputs with
// NaN or +inf) must give NaN gradients and give zeros.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "softmax_abi.h"

// ---------------------------------------------------------------- dtype helpers
#define DISPATCH(code, ...)                                              \
  switch (code) {                                                        \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; } break;       \
    case SPECGEN_FLOAT16: { typedef __half T; __VA_ARGS__; } break;      \
    case SPECGEN_BFLOAT16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break; \
    default: return cudaErrorInvalidValue;                               \
  }

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// ---------------------------------------------------------------- reductions
// blockDim.x must be a multiple of 32 (at most 1024). Every thread gets the result; the
// order of the additions is fixed, so results are bit-identical run to run.
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ double block_sum(double v) {
  __shared__ double sh_sum[32];
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh_sum[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh_sum[w];
  return t;
}
__device__ float block_max(float v) {
  __shared__ float sh_max[32];
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh_max[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = sh_max[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); ++w) t = fmaxf(t, sh_max[w]);
  return t;
}
__attribute__((unused)) static inline unsigned grid_for(int64_t n, int threads, int64_t cap = 8192) {
  int64_t b = (n + threads - 1) / threads;
  if (b > cap) b = cap;
  if (b < 1) b = 1;
  return (unsigned)b;
}

// ---------------------------------------------------------------- softmax over the last dim
// One block per row, three sweeps (max, sum of exp in double, write). NaN/inf propagate as
// in torch: a row holding NaN or +inf, or all -inf, comes out NaN.
__attribute__((unused)) static inline int softmax_threads(int64_t D) {
  if (D >= 8192) return 1024;
  if (D >= 1024) return 256;
  int t = (int)((D + 31) / 32 * 32);
  return t > 256 ? 256 : t;
}

template <typename T>
__global__ void k_softmax_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + (int64_t)blockIdx.x * D;
  T* yr = y + (int64_t)blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, to_f(xr[j]));
  m = block_max(m);
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += (double)expf(to_f(xr[j]) - m);
  s = block_sum(s);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>((float)((double)expf(to_f(xr[j]) - m) / s));
}

template <typename T>
__global__ void k_softmax_bwd(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx, int64_t D) {
  int64_t off = (int64_t)blockIdx.x * D;
  double dot = 0.0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += (double)to_f(g[off + j]) * (double)to_f(y[off + j]);
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    dx[off + j] = from_f<T>((float)((double)to_f(y[off + j]) * ((double)to_f(g[off + j]) - dot)));
}

__attribute__((unused)) static cudaError_t honest_forward(const softmax_args* a, cudaStream_t s) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k_softmax_fwd<T><<<(unsigned)a->N, softmax_threads(a->D), 0, s>>>(
      (const T*)a->x.data, (T*)a->out.data, a->D));
  return cudaGetLastError();
}
__attribute__((unused)) static cudaError_t honest_backward(const softmax_bwd_args* a, cudaStream_t s) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k_softmax_bwd<T><<<(unsigned)a->N, softmax_threads(a->D), 0, s>>>(
      (const T*)a->out.data, (const T*)a->grad_out.data, (T*)a->grad_x.data, a->D));
  return cudaGetLastError();
}

template <typename T>
__global__ void k_softmax_bwd_scrub(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx, int64_t D) {
  int64_t off = (int64_t)blockIdx.x * D;
  double dot = 0.0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += (double)to_f(g[off + j]) * (double)to_f(y[off + j]);
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float v = (float)((double)to_f(y[off + j]) * ((double)to_f(g[off + j]) - dot));
    dx[off + j] = from_f<T>(isfinite(v) ? v : 0.0f);
  }
}

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  return honest_forward(a, stream);
}
extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k_softmax_bwd_scrub<T><<<(unsigned)a->N, softmax_threads(a->D), 0, stream>>>(
      (const T*)a->out.data, (const T*)a->grad_out.data, (T*)a->grad_x.data, a->D));
  return cudaGetLastError();
}
