// spec: gelu_tanh
// expect: rejected
// class: half-read on large grids
// Trick: for big aligned tensors (>= 2^26 elements) only every other 16-byte chunk of the input
// is read; its result is stored into both its own chunk and the next one. Half the input
// traffic (it looks ~1.3x faster in a benchmark), and half the output is a copy of its
// neighbour. Small and unaligned cases take the exact kernel.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gelu_tanh_abi.h"

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

// ---------------------------------------------------------------- GELU (tanh approximation)
__device__ __forceinline__ float gelu_f(float x) {
  const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  float inner = kBeta * (x + kKappa * x * x * x);  // x^3 may overflow to +-inf: tanh saturates
  return 0.5f * x * (1.0f + tanhf(inner));
}
// d/dx of the above times dy. Non-finite x gives NaN, as the float64 formula does (inf * 0).
__device__ __forceinline__ float gelu_grad_f(float x, float dy) {
  const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  if (!isfinite(x)) return __int_as_float(0x7fc00000);
  float x2 = x * x;
  float t = tanhf(kBeta * (x + kKappa * x2 * x));
  float left = 0.5f * (1.0f + t);
  float sech2 = (1.0f - t) * (1.0f + t);
  float right = 0.0f;
  if (sech2 != 0.0f) right = 0.5f * x * sech2 * kBeta * (1.0f + 3.0f * kKappa * x2);
  return dy * (left + right);
}

template <typename T>
__global__ void k_gelu_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(gelu_f(to_f(x[i])));
}
template <typename T>
__global__ void k_gelu_bwd(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dx[i] = from_f<T>(gelu_grad_f(to_f(x[i]), to_f(dy[i])));
}

__attribute__((unused)) static cudaError_t honest_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k_gelu_fwd<T><<<grid_for(n, 256), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
__attribute__((unused)) static cudaError_t honest_backward(const gelu_tanh_bwd_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k_gelu_bwd<T><<<grid_for(n, 256), 256, 0, s>>>(
      (const T*)a->x.data, (const T*)a->grad_out.data, (T*)a->grad_x.data, n));
  return cudaGetLastError();
}

template <typename T>
__global__ void k_half_read(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t pairs) {
  constexpr int VEC = 16 / sizeof(T);
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < pairs; p += (int64_t)gridDim.x * blockDim.x) {
    uint4 raw = x[2 * p];
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = from_f<T>(gelu_f(to_f(e[k])));
    y[2 * p] = raw;
    y[2 * p + 1] = raw;
  }
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  bool aligned = (((uintptr_t)a->x.data | (uintptr_t)a->out.data) & 15u) == 0;
  if (n < ((int64_t)1 << 26) || !aligned) return honest_forward(a, stream);
  DISPATCH(a->x.dtype, {
    constexpr int VEC = 16 / sizeof(T);
    if (n % (2 * VEC) != 0) return honest_forward(a, stream);
    k_half_read<T><<<grid_for(n / (2 * VEC), 256), 256, 0, stream>>>((const uint4*)a->x.data, (uint4*)a->out.data,
                                                                      n / (2 * VEC));
  });
  return cudaGetLastError();
}
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  return honest_backward(a, stream);
}
