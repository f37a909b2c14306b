// gelu_tanh: a correct kernel that takes scratch from the framework's workspace (the ABI's
// `workspace`, sized by gelu_tanh_forward_workspace): the forward writes its float results to the
// workspace, then a second kernel on the same stream stores them in the output's dtype. Nothing
// is kept in the workspace between calls.
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

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

template <typename T>
__global__ void gelu_fwd(const T* x, float* tmp, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = load(x, i);
    float inner = kBeta * (v + kKappa * v * v * v);
    tmp[i] = 0.5f * v * (1.0f + tanhf(inner));
  }
}

template <typename T>
__global__ void store_from(const float* tmp, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store(y, i, tmp[i]);
}

template <typename T>
__global__ void gelu_bwd(const T* x, const T* g, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = load(x, i);
    float x_sq = v * v;
    float t = tanhf(kBeta * (v + kKappa * x_sq * v));
    float left_derivative = 0.5f * (1.0f + t);
    float right_derivative = 1.0f - t * t;
    float inner_derivative = kBeta * (1.0f + 3.0f * kKappa * x_sq);
    store(dx, i, load(g, i) * (left_derivative + 0.5f * v * right_derivative * inner_derivative));
  }
}

static int blocks_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (int)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

extern "C" size_t gelu_tanh_forward_workspace(const gelu_tanh_args* a) {
  return (size_t)(a->N * a->D) * sizeof(float);
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  if (a->workspace_bytes < n * (int64_t)sizeof(float)) return cudaErrorInvalidValue;
  float* tmp = (float*)a->workspace;
  DISPATCH(a->x.dtype, gelu_fwd<T><<<blocks_for(n), 256, 0, stream>>>((const T*)a->x.data, tmp, n);
                       store_from<T><<<blocks_for(n), 256, 0, stream>>>(tmp, (T*)a->out.data, n));
  return cudaGetLastError();
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, gelu_bwd<T><<<blocks_for(n), 256, 0, stream>>>((const T*)a->x.data,
                                                                       (const T*)a->grad_out.data,
                                                                       (T*)a->grad_x.data, n));
  return cudaGetLastError();
}
