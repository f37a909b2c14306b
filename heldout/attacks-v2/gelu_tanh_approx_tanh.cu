// spec: gelu_tanh
// expect: passed
// class: fast-math-precision
// reason: passed
//
// Uses the hardware tanh.approx.f32 (about 2^-11 relative error) for every dtype, float32
// included: fine for bf16 storage, far outside float32's tolerance.
//
// Relabeled 2026-12-03 from "rejected" to "passed" (the rest of the file is as written): the
// claim above is false. The dev suite's tests/adversarial/gelu_tanh_approx_ptx.cu, the same
// instruction in every dtype, measured a largest float32 error of 5.7e-6 on the H200
// (2026-12-01, 572 cases, float32 cases of 5e8 elements), inside the spec's atol of 1e-5:
// gelu's error is 0.5|x| times tanh's, and tanh.approx's absolute error is small where |x|
// is large. An approximation within the spec's tolerance is a legitimate kernel.

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

__device__ __forceinline__ float tanh_fast(float v) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float gelu_f(float x) {
  const float inner = K_BETA * (x + K_KAPPA * x * x * x);
  return 0.5f * x * (1.f + tanh_fast(inner));
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
static cudaError_t fwd(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
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
