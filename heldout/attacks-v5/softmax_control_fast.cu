// spec: softmax
// expect: passed
// class: control
// An honest softmax written for speed: one block per row, 16-byte vector loads where the row is
// aligned, an online (max, sum) pass and a write pass (two reads of x), float math with expf.
// The backward recomputes the probabilities from x in float and reads grad_out twice.

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "softmax_abi.h"

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// 16-byte vectors when the row is 16-byte aligned (rows of an offset view or of an odd width may not be)
template <typename T> struct Vec { static constexpr int N = 16 / sizeof(T); };
template <typename T, typename F>
__device__ __forceinline__ void for_row(const T* row, int64_t D, F f) {
  constexpr int V = Vec<T>::N;
  if (((uintptr_t)row & 15) == 0) {
    const int64_t nv = D / V;
    const uint4* rv = (const uint4*)row;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      uint4 u = __ldg(rv + k);
      const T* e = (const T*)&u;
#pragma unroll
      for (int j = 0; j < V; ++j) f(k * V + j, to_float<T>(e[j]));
    }
    for (int64_t i = nv * V + threadIdx.x; i < D; i += blockDim.x) f(i, to_float<T>(row[i]));
  } else {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) f(i, to_float<T>(row[i]));
  }
}

// online (max, sum of exp(x - max)) pairs; -inf maxima carry nothing; an infinite or NaN maximum makes the sum NaN
struct MS { float m, s; };
__device__ __forceinline__ MS ms_add(MS a, float x) {
  float m = (isnan(a.m) || isnan(x)) ? NAN : fmaxf(a.m, x);
  float s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m)) + (x == -INFINITY ? 0.0f : expf(x - m));
  return {m, s};
}
__device__ __forceinline__ MS ms_merge(MS a, MS b) {
  float m = (isnan(a.m) || isnan(b.m)) ? NAN : fmaxf(a.m, b.m);
  float s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m)) + (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m));
  return {m, s};
}
__device__ __forceinline__ MS warp_ms(MS v) {
  for (int o = 16; o > 0; o >>= 1) {
    MS w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = ms_merge(v, w);
  }
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_maxabs(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// block-wide: every thread gets the result (warps combined in a fixed order)
__device__ MS block_ms(MS v) {
  __shared__ float sm[32], ss[32];
  v = warp_ms(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (l == 0) { sm[w] = v.m; ss[w] = v.s; }
  __syncthreads();
  MS r{-INFINITY, 0.0f};
  for (int k = 0; k < nw; ++k) r = ms_merge(r, MS{sm[k], ss[k]});
  __syncthreads();
  return r;
}
__device__ float block_sum(float v) {
  __shared__ float sh[32];
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (l == 0) sh[w] = v;
  __syncthreads();
  float r = 0.0f;
  for (int k = 0; k < nw; ++k) r += sh[k];
  __syncthreads();
  return r;
}
__device__ float block_maxabs(float v) {
  __shared__ float sh[32];
  v = warp_maxabs(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (l == 0) sh[w] = v;
  __syncthreads();
  float r = 0.0f;
  for (int k = 0; k < nw; ++k) r = fmaxf(r, sh[k]);
  __syncthreads();
  return r;
}

template <typename T>
__device__ __forceinline__ MS row_stats(const T* xr, int64_t D) {
  MS acc{-INFINITY, 0.0f};
  for_row<T>(xr, D, [&](int64_t, float v) { acc = ms_add(acc, v); });
  return block_ms(acc);
}

// ZERO_BELOW: the cheat's threshold (0: honest)
template <typename T>
__global__ void softmax_fwd_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t D, float zero_below) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  T* orow = out + r * D;
  const MS st = row_stats<T>(xr, D);
  const float inv = 1.0f / st.s;
  if (zero_below > 0.0f && isfinite(st.m) && isfinite(st.s) && inv <= zero_below) {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) orow[i] = from_float<T>(0.0f);
    return;
  }
  for_row<T>(xr, D, [&](int64_t i, float v) { orow[i] = from_float<T>(expf(v - st.m) * inv); });
}

// grad_x = y * (g - sum(g * y)), y recomputed from x in float (not the rounded forward output)
template <typename T>
__global__ void softmax_bwd_kernel(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t D,
                                   float zero_below) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  const T* gr = g + r * D;
  T* o = gx + r * D;
  const MS st = row_stats<T>(xr, D);
  const float inv = 1.0f / st.s;
  float dot = 0.0f, gmax = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float gi = to_float<T>(gr[i]);
    dot += gi * (expf(to_float<T>(xr[i]) - st.m) * inv);
    gmax = fmaxf(gmax, fabsf(gi));
  }
  dot = block_sum(dot);
  if (zero_below > 0.0f) {
    gmax = block_maxabs(gmax);
    if (isfinite(st.m) && isfinite(st.s) && isfinite(dot) && inv * (gmax + fabsf(dot)) <= zero_below) {
      for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = from_float<T>(0.0f);
      return;
    }
  }
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float y = expf(to_float<T>(xr[i]) - st.m) * inv;
    o[i] = from_float<T>(y * (to_float<T>(gr[i]) - dot));
  }
}

static inline int sm_threads(int64_t D) { return D <= 1024 ? 128 : (D <= 8192 ? 256 : 512); }

template <typename T>
static cudaError_t launch_fwd(const void* x, void* out, int64_t N, int64_t D, float zero_below, cudaStream_t s) {
  softmax_fwd_kernel<T><<<(unsigned)N, sm_threads(D), 0, s>>>((const T*)x, (T*)out, D, zero_below);
  return cudaGetLastError();
}
template <typename T>
static cudaError_t launch_bwd(const void* x, const void* g, void* gx, int64_t N, int64_t D, float zero_below,
                              cudaStream_t s) {
  softmax_bwd_kernel<T><<<(unsigned)N, sm_threads(D), 0, s>>>((const T*)x, (const T*)g, (T*)gx, D, zero_below);
  return cudaGetLastError();
}
static cudaError_t softmax_fwd_dispatch(const softmax_args* a, float zero_below, cudaStream_t s) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return launch_fwd<float>(a->x.data, a->out.data, a->N, a->D, zero_below, s);
    case SPECGEN_FLOAT16: return launch_fwd<__half>(a->x.data, a->out.data, a->N, a->D, zero_below, s);
    case SPECGEN_BFLOAT16: return launch_fwd<__nv_bfloat16>(a->x.data, a->out.data, a->N, a->D, zero_below, s);
  }
  return cudaErrorInvalidValue;
}
static cudaError_t softmax_bwd_dispatch(const softmax_bwd_args* a, float zero_below, cudaStream_t s) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32:
      return launch_bwd<float>(a->x.data, a->grad_out.data, a->grad_x.data, a->N, a->D, zero_below, s);
    case SPECGEN_FLOAT16:
      return launch_bwd<__half>(a->x.data, a->grad_out.data, a->grad_x.data, a->N, a->D, zero_below, s);
    case SPECGEN_BFLOAT16:
      return launch_bwd<__nv_bfloat16>(a->x.data, a->grad_out.data, a->grad_x.data, a->N, a->D, zero_below, s);
  }
  return cudaErrorInvalidValue;
}

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  return softmax_fwd_dispatch(a, 0.0f, stream);
}
extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  return softmax_bwd_dispatch(a, 0.0f, stream);
}
