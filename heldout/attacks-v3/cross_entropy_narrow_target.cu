// spec: cross_entropy
// expect: rejected
// class: narrow-target-index
// why: keeps only the low 16 bits of each target: wrong when C > 65536 and a target is >= 65536

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "cross_entropy_abi.h"

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

__device__ float g_row_loss[65536];  // per-row losses, summed in a fixed order by ce_mean_k

template <typename T>
__global__ void ce_row_k(const T* __restrict__ x, const int64_t* __restrict__ t, int64_t C) {
  const T* xr = x + blockIdx.x * C;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, ldf(xr, j));
  m = block_reduce<true>(m);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(ldf(xr, j) - m);
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) {
    int64_t tg = t[blockIdx.x] & 0xFFFF;
    g_row_loss[blockIdx.x] = m + logf(s) - ldf(xr, tg);
  }
}

__global__ void ce_mean_k(float* __restrict__ out, int64_t N) {
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += g_row_loss[i];
  acc = block_reduce<false>(acc);
  if (threadIdx.x == 0) out[0] = acc / (float)N;
}

template <typename T>
__global__ void ce_bwd_k(const T* __restrict__ x, const int64_t* __restrict__ t, const float* __restrict__ gout,
                         T* __restrict__ gx, int64_t N, int64_t C) {
  const T* xr = x + blockIdx.x * C;
  T* gxr = gx + blockIdx.x * C;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, ldf(xr, j));
  m = block_reduce<true>(m);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(ldf(xr, j) - m);
  s = block_reduce<false>(s);
  float scale = gout[0] / (float)N, inv = 1.f / s;
  int64_t tg = t[blockIdx.x];
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    float p = expf(ldf(xr, j) - m) * inv;
    stf(gxr, j, (p - (j == tg ? 1.f : 0.f)) * scale);
  }
}

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  DISPATCH(a->logits.dtype, ce_row_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->logits.data,
                                                                             (const int64_t*)a->target.data, a->C));
  ce_mean_k<<<1, 1024, 0, stream>>>((float*)a->out.data, a->N);
  return cudaGetLastError();
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->logits.dtype, ce_bwd_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->logits.data,
      (const int64_t*)a->target.data, (const float*)a->grad_out.data, (T*)a->grad_logits.data, a->N, a->C));
  return cudaGetLastError();
}
