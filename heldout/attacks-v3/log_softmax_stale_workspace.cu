// spec: log_softmax
// expect: rejected
// class: stale-workspace-size
// why: a per-row workspace is sized by the first call's N and reused: a later call with more rows wraps around and rows share (overwrite) each other's statistics

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "log_softmax_abi.h"

__device__ __forceinline__ float ldf(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ldf(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ldf(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void stf(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stf(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void stf(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// Block-wide sum / max over blockDim.x threads (a multiple of 32); every thread gets the result.
template <bool MAX>
__device__ float block_reduce(float v) {
  __shared__ float sh[33];
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  if (wid == 0) {
    v = lane < nw ? sh[lane] : (MAX ? -INFINITY : 0.f);
    for (int o = 16; o > 0; o >>= 1) {
      float w = __shfl_xor_sync(0xffffffffu, v, o);
      v = MAX ? fmaxf(v, w) : v + w;
    }
    if (lane == 0) sh[32] = v;
  }
  __syncthreads();
  return sh[32];
}

__attribute__((unused)) static inline int grid_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  if (b < 1) b = 1;
  if (b > 262144) b = 262144;
  return (int)b;
}

#define DISPATCH(dt, ...)                                                       \
  switch (dt) {                                                                 \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; break; }             \
    case SPECGEN_FLOAT16: { typedef __half T; __VA_ARGS__; break; }            \
    case SPECGEN_BFLOAT16: { typedef __nv_bfloat16 T; __VA_ARGS__; break; }    \
    default: return cudaErrorInvalidValue;                                      \
  }

template <typename T>
__global__ void lsm_fwd_k(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + blockIdx.x * D;
  T* yr = y + blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, ldf(xr, j));
  m = block_reduce<true>(m);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(ldf(xr, j) - m);
  s = block_reduce<false>(s);
  float lse = m + logf(s);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) stf(yr, j, ldf(xr, j) - lse);
}

template <typename T>
__global__ void lsm_bwd_k(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const T* xr = x + blockIdx.x * D;
  const T* gr = g + blockIdx.x * D;
  T* gxr = gx + blockIdx.x * D;
  float m = -INFINITY, gs = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { m = fmaxf(m, ldf(xr, j)); gs += ldf(gr, j); }
  m = block_reduce<true>(m);
  gs = block_reduce<false>(gs);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(ldf(xr, j) - m);
  s = block_reduce<false>(s);
  float lse = m + logf(s);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) stf(gxr, j, ldf(gr, j) - expf(ldf(xr, j) - lse) * gs);
}


static float* g_ws = 0;      // per-row logsumexp, sized at the first call
static int64_t g_ws_rows = 0;

template <typename T>
__global__ void lsm_stats_k(const T* __restrict__ x, float* ws, int64_t cap, int64_t D) {
  const T* xr = x + blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, ldf(xr, j));
  m = block_reduce<true>(m);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(ldf(xr, j) - m);
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) ws[blockIdx.x % cap] = m + logf(s);
}

template <typename T>
__global__ void lsm_apply_k(const T* __restrict__ x, const float* ws, int64_t cap, T* __restrict__ y, int64_t D) {
  float lse = ws[blockIdx.x % cap];
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) stf(y, blockIdx.x * D + j, ldf(x, blockIdx.x * D + j) - lse);
}

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  if (!g_ws) { g_ws_rows = a->N; if (cudaMalloc(&g_ws, sizeof(float) * g_ws_rows) != cudaSuccess) return cudaErrorMemoryAllocation; }
  DISPATCH(a->x.dtype,
    lsm_stats_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, g_ws, g_ws_rows, a->D);
    lsm_apply_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, g_ws, g_ws_rows, (T*)a->out.data, a->D));
  return cudaGetLastError();
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, lsm_bwd_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data,
                                                                        (const T*)a->grad_out.data, (T*)a->grad_x.data, a->D));
  return cudaGetLastError();
}
