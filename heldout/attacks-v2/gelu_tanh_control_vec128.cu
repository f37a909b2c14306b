// spec: gelu_tanh
// expect: passed
// class: control-fast-vectorized
// reason: passed
//
// control: must pass. 128-bit loads and stores, two vectors in flight per thread, a scalar
// path for offset views and the tail; 16-bit dtypes use tanh from __expf (error far below
// their rounding), float32 uses tanhf.

#include "gelu_tanh_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

#define DISPATCH(dtype, FN, ...)                                        \
  switch (dtype) {                                                      \
    case SPECGEN_FLOAT32: return FN<float>(__VA_ARGS__);                \
    case SPECGEN_FLOAT16: return FN<__half>(__VA_ARGS__);               \
    case SPECGEN_BFLOAT16: return FN<__nv_bfloat16>(__VA_ARGS__);       \
    default: return cudaErrorInvalidValue;                              \
  }

[[maybe_unused]] static inline unsigned grid_for(int64_t n, int block, int64_t cap = 65535) {
  int64_t g = (n + block - 1) / block;
  if (g < 1) g = 1;
  return (unsigned)(g < cap ? g : cap);
}

#define K_BETA 0.7978845608028654f
#define K_KAPPA 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
  const float inner = K_BETA * (x + K_KAPPA * x * x * x);
  return 0.5f * x * (1.f + tanhf(inner));
}

// the derivative exactly as aten writes it (same NaN/Inf behaviour)
__device__ __forceinline__ float gelu_grad_f(float dy, float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = K_BETA * (x + K_KAPPA * x_cube);
  const float t = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.f + t;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.f - t * t;
  const float inner_derivative = K_BETA * (1.f + 3.f * K_KAPPA * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

template <typename T>
__global__ void gelu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(gelu_f(to_f(x[i])));
}

template <typename T>
__global__ void gelu_bwd_kernel(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    gx[i] = from_f<T>(gelu_grad_f(to_f(g[i]), to_f(x[i])));
}

template <typename T>
__device__ __forceinline__ float gelu_fast(float x) {
  if constexpr (sizeof(T) == 2) {
    const float inner = K_BETA * (x + K_KAPPA * x * x * x);
    const float t = 1.f - __fdividef(2.f, 1.f + __expf(2.f * inner));
    return 0.5f * x * (1.f + t);
  } else {
    return gelu_f(x);
  }
}

template <typename T>
__global__ void __launch_bounds__(256) gelu_fwd_vec(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t nv) {
  constexpr int V = 16 / sizeof(T);
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += 2 * stride) {
    uint4 r0 = x[i];
    uint4 r1 = (i + stride < nv) ? x[i + stride] : make_uint4(0, 0, 0, 0);
    T* e0 = reinterpret_cast<T*>(&r0);
    T* e1 = reinterpret_cast<T*>(&r1);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      e0[k] = from_f<T>(gelu_fast<T>(to_f(e0[k])));
      e1[k] = from_f<T>(gelu_fast<T>(to_f(e1[k])));
    }
    y[i] = r0;
    if (i + stride < nv) y[i + stride] = r1;
  }
}

template <typename T>
__global__ void gelu_fwd_tail(const T* __restrict__ x, T* __restrict__ y, int64_t from, int64_t n) {
  for (int64_t i = from + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(gelu_fast<T>(to_f(x[i])));
}

template <typename T>
static cudaError_t fwd(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  const bool aligned = ((uintptr_t)a->x.data % 16 == 0) && ((uintptr_t)a->out.data % 16 == 0);
  if (aligned) {
    constexpr int V = 16 / sizeof(T);
    const int64_t nv = n / V;
    if (nv > 0) {
      static int sms = 0;  // asked once (the first call is never a capture)
      if (sms <= 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 132;
      }
      int64_t blocks = (nv + 511) / 512;
      const int64_t cap = (int64_t)sms * 8;
      if (blocks > cap) blocks = cap;
      gelu_fwd_vec<T><<<(unsigned)blocks, 256, 0, s>>>((const uint4*)a->x.data, (uint4*)a->out.data, nv);
    }
    if (nv * V < n)
      gelu_fwd_tail<T><<<1, 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, nv * V, n);
    return cudaGetLastError();
  }
  gelu_fwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const gelu_tanh_bwd_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  gelu_bwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data,
                                                               (T*)a->grad_x.data, n);
  return cudaGetLastError();
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, fwd, a, stream)
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, bwd, a, stream)
}
