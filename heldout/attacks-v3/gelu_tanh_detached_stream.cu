// spec: gelu_tanh
// expect: rejected
// class: detached-side-stream
// why: the forward runs on its own non-blocking stream and never joins `stream`: nothing on `stream` waits for the result, so timings on `stream` see an idle GPU

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "gelu_tanh_abi.h"

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
__device__ __forceinline__ float gelu_grad_f(float x, float dy) {
  const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  float x_sq = x * x;
  float inner = kBeta * (x + kKappa * x_sq * x);
  float t = tanhf(inner);
  float left = 0.5f * x, right = 1.f + t;
  float left_d = 0.5f * right;
  float right_d = left * (1.f - t * t) * kBeta * (1.f + 3.f * kKappa * x_sq);
  return dy * (left_d + right_d);
}

template <typename T>
__global__ void gelu_fwd_k(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = ldf(x, i);
    stf(y, i, gelu_f(v));
  }
}

template <typename T>
__global__ void gelu_bwd_k(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    stf(gx, i, gelu_grad_f(ldf(x, i), ldf(g, i)));
  }
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  static cudaStream_t side = 0;
  if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  DISPATCH(a->x.dtype, gelu_fwd_k<T><<<grid_for(n), 256, 0, side>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  DISPATCH(a->x.dtype, gelu_bwd_k<T><<<grid_for(n), 256, 0, stream>>>((const T*)a->x.data, (const T*)a->grad_out.data,
                                                                      (T*)a->grad_x.data, n));
  return cudaGetLastError();
}
