// Shared by the rmsnorm adversarial kernels (test scaffolding only).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "rmsnorm_abi.h"

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

#define STUB_BACKWARD                                                                              \
  extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args*, cudaStream_t) {                 \
    return cudaErrorNotSupported;                                                                   \
  }

// A fixed-order reduction over a block of 256 threads (every thread gets the result), for the
// forwards below; and an honest backward (one block per row, then a thread per column for the
// weight's gradient), for the kernels whose cheat is in the forward only: today's verifier checks
// both directions, so a forward cheat that is meant to pass it needs a correct backward too.
template <bool kMax> __device__ float block_reduce256(float v) {
  __shared__ float partial[8];
  for (int o = 16; o > 0; o >>= 1) {
    float other = __shfl_xor_sync(0xffffffff, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // `partial` may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = partial[0];
  for (int w = 1; w < 8; ++w) total = kMax ? fmaxf(total, partial[w]) : total + partial[w];
  return total;
}
template <typename T>
__global__ void honest_rms_bwd_x(const T* x, const T* w, const T* g, T* dx, float* rstd_out, int64_t D, float eps) {
  const T* row = x + blockIdx.x * D;
  const T* grow = g + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += 256) { float v = load(row, j); ss += v * v; }
  float rstd = rsqrtf(block_reduce256<false>(ss) / (float)D + eps);
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += 256) dot += load(grow, j) * load(w, j) * load(row, j) * rstd;
  float mean_dot = block_reduce256<false>(dot) / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += 256)
    store(dx + blockIdx.x * D, j, rstd * (load(grow, j) * load(w, j) - load(row, j) * rstd * mean_dot));
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
}
template <typename T>
__global__ void honest_rms_bwd_w(const T* x, const T* g, const float* rstd, T* dw, int64_t N, int64_t D) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  float acc = 0.f;
  for (int64_t n = 0; n < N; ++n) acc += load(g, n * D + j) * load(x, n * D + j) * rstd[n];
  store(dw, j, acc);
}
#define HONEST_BACKWARD                                                                            \
  extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t s) {              \
    if (a->N == 0 || a->D == 0) return cudaSuccess;                                                 \
    float* rstd = nullptr;                                                                          \
    cudaError_t err = cudaMallocAsync((void**)&rstd, a->N * sizeof(float), s);                      \
    if (err != cudaSuccess) return err;                                                             \
    DISPATCH(a->x.dtype,                                                                            \
             honest_rms_bwd_x<T><<<(unsigned)a->N, 256, 0, s>>>(                                    \
                 (const T*)a->x.data, (const T*)a->weight.data, (const T*)a->grad_out.data,         \
                 (T*)a->grad_x.data, rstd, a->D, (float)a->eps);                                    \
             honest_rms_bwd_w<T><<<(unsigned)((a->D + 255) / 256), 256, 0, s>>>(                   \
                 (const T*)a->x.data, (const T*)a->grad_out.data, rstd, (T*)a->grad_weight.data,    \
                 a->N, a->D));                                                                      \
    err = cudaGetLastError();                                                                       \
    cudaFreeAsync(rstd, s);                                                                         \
    return err;                                                                                     \
  }
