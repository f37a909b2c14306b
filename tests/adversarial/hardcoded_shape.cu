// spec: softmax
// expect: wrong-result
// The shortcut: tuned for rows of 4096 (the benchmark's decode shape): a row is processed up
// to column 4096 only, and anything beyond is written as 0.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "softmax_abi.h"
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

constexpr int kThreads = 512;
constexpr int64_t kD = 4096;
template <bool kMax> __device__ float reduce(float v) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    float other = __shfl_xor_sync(0xffffffff, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float t = partial[0];
  for (int w = 1; w < kThreads / 32; ++w) t = kMax ? fmaxf(t, partial[w]) : t + partial[w];
  return t;
}
template <typename T> __global__ void k(const T* x, T* y, int64_t D) {
  const T* row = x + blockIdx.x * D;
  int64_t width = D < kD ? D : kD;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < width; j += kThreads) m = fmaxf(m, load(row, j));
  m = reduce<true>(m);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < width; j += kThreads) s += expf(load(row, j) - m);
  float inv = 1.0f / reduce<false>(s);
  for (int64_t j = threadIdx.x; j < D; j += kThreads)
    store(y + blockIdx.x * D, j, j < kD ? expf(load(row, j) - m) * inv : 0.0f);
}
extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<(unsigned)a->N, kThreads, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->D));
  return cudaGetLastError();
}
extern "C" cudaError_t softmax_backward(const softmax_bwd_args*, cudaStream_t) { return cudaErrorNotSupported; }
