// Shared by the gelu_tanh adversarial kernels: dtype dispatch, float load/store, the math.
// (Test scaffolding only: a real candidate is one self-contained .cu file.)
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gelu_tanh_abi.h"

#define DISPATCH(code, ...)                                                              \
  switch (code) {                                                                        \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; break; }                       \
    case SPECGEN_FLOAT16: { typedef __half T; __VA_ARGS__; break; }                      \
    case SPECGEN_BFLOAT16: { typedef __nv_bfloat16 T; __VA_ARGS__; break; }              \
    default: return cudaErrorInvalidValue;                                               \
  }

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

static inline int blocks_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (int)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// The backward is never reached by these kernels' tests (the forward is rejected first).
#define STUB_BACKWARD                                                                              \
  extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args*, cudaStream_t) {              \
    return cudaErrorNotSupported;                                                                   \
  }

// An honest backward, for the kernels whose cheat is in the forward only: today's verifier checks
// both directions, so a forward cheat that is meant to pass it needs a correct backward too.
template <typename T> __global__ void honest_gelu_bwd(const T* x, const T* g, T* dx, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = load(x, i);
    float t = tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v));
    float inner = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * v * v);
    store(dx, i, load(g, i) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * inner));
  }
}
#define HONEST_BACKWARD                                                                            \
  extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t s) {          \
    int64_t n = a->N * a->D;                                                                        \
    if (n == 0) return cudaSuccess;                                                                 \
    DISPATCH(a->x.dtype, honest_gelu_bwd<T><<<blocks_for(n), 256, 0, s>>>(                          \
        (const T*)a->x.data, (const T*)a->grad_out.data, (T*)a->grad_x.data, n));                   \
    return cudaGetLastError();                                                                      \
  }
