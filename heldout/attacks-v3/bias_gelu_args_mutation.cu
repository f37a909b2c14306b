// spec: bias_gelu
// expect: rejected
// class: args-struct-mutation
// why: the forward writes into the caller's const argument struct (zeroes N after launching), so a caller reusing the struct gets an empty second call

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "bias_gelu_abi.h"

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

__device__ __forceinline__ float gelu_f(float x) {
  const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  float inner = kBeta * (x + kKappa * x * x * x);
  return 0.5f * x * (1.f + tanhf(inner));
}
__device__ __forceinline__ float gelu_grad_f(float x) {
  const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  float x_sq = x * x;
  float t = tanhf(kBeta * (x + kKappa * x_sq * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kBeta * (1.f + 3.f * kKappa * x_sq);
}

template <typename T>
__global__ void bg_fwd_k(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y, int64_t N, int64_t D) {
  int64_t n = N * D;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t col = i % D;
    // x + bias is rounded to the working dtype first, as in the reference
    T s; stf(&s, 0, ldf(x, i) + ldf(b, col));
    stf(y, i, gelu_f(ldf(&s, 0)));
  }
}

template <typename T>
__global__ void bg_bwd_x_k(const T* __restrict__ x, const T* __restrict__ b, const T* __restrict__ g, T* __restrict__ gx,
                           int64_t N, int64_t D) {
  int64_t n = N * D;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t col = i % D;
    T s; stf(&s, 0, ldf(x, i) + ldf(b, col));
    stf(gx, i, ldf(g, i) * gelu_grad_f(ldf(&s, 0)));
  }
}

template <typename T>
__global__ void bg_bwd_b_k(const T* __restrict__ x, const T* __restrict__ b, const T* __restrict__ g, T* __restrict__ gb,
                           int64_t N, int64_t D) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  float acc = 0.f, bj = ldf(b, j);
  for (int64_t r = 0; r < N; ++r) {
    T s; stf(&s, 0, ldf(x, r * D + j) + bj);
    acc += ldf(g, r * D + j) * gelu_grad_f(ldf(&s, 0));
  }
  stf(gb, j, acc);
}

extern "C" cudaError_t bias_gelu_forward(const bias_gelu_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  DISPATCH(a->x.dtype, bg_fwd_k<T><<<grid_for(n), 256, 0, stream>>>((const T*)a->x.data, (const T*)a->bias.data,
                                                                    (T*)a->out.data, a->N, a->D));
  ((bias_gelu_args*)a)->N = 0;  // 'consumed'
  return cudaGetLastError();
}

extern "C" cudaError_t bias_gelu_backward(const bias_gelu_bwd_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  DISPATCH(a->x.dtype,
    bg_bwd_x_k<T><<<grid_for(n), 256, 0, stream>>>((const T*)a->x.data, (const T*)a->bias.data,
        (const T*)a->grad_out.data, (T*)a->grad_x.data, a->N, a->D);
    bg_bwd_b_k<T><<<(unsigned)((a->D + 127) / 128), 128, 0, stream>>>((const T*)a->x.data, (const T*)a->bias.data,
        (const T*)a->grad_out.data, (T*)a->grad_bias.data, a->N, a->D));
  return cudaGetLastError();
}
