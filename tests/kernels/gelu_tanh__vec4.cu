// gelu_tanh, variant vec4: a correct kernel that must pass. The forward moves 16 bytes per
// load/store (4 float32 or 8 half-precision elements): a scalar head brings the input to a
// 16-byte boundary (input views may start at any element), vectors cover the middle, a scalar
// tail the rest; the stores are vectors too when the output is aligned the same way, else
// scalar. The backward is a plain grid-stride loop.
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

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.0f + tanhf(kBeta * (v + kKappa * v * v * v))); }

template <typename T>
__global__ void gelu_fwd_vec(const T* x, T* y, int64_t n, int64_t head, bool vector_stores) {
  constexpr int V = 16 / sizeof(T);
  const int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  if (tid < head) y[tid] = from_float<T>(gelu(to_float(x[tid])));
  const int64_t vectors = (n - head) / V;
  const uint4* xv = reinterpret_cast<const uint4*>(x + head);
  for (int64_t v = tid; v < vectors; v += stride) {
    uint4 in = xv[v], out;
    const T* e = reinterpret_cast<const T*>(&in);
    T* r = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < V; ++k) r[k] = from_float<T>(gelu(to_float(e[k])));
    if (vector_stores) {
      reinterpret_cast<uint4*>(y + head)[v] = out;
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) y[head + v * V + k] = r[k];
    }
  }
  for (int64_t i = head + vectors * V + tid; i < n; i += stride) y[i] = from_float<T>(gelu(to_float(x[i])));
}

template <typename T>
__global__ void gelu_bwd(const T* x, const T* g, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = to_float(x[i]);
    float t = tanhf(kBeta * (v + kKappa * v * v * v));
    float inner = kBeta * (1.0f + 3.0f * kKappa * v * v);
    dx[i] = from_float<T>(to_float(g[i]) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * inner));
  }
}

static int blocks_for(int64_t work) {
  int64_t b = (work + 255) / 256;
  return (int)(b < 8192 ? (b > 0 ? b : 1) : 8192);
}

template <typename T>
static void launch_forward(const T* x, T* y, int64_t n, cudaStream_t stream) {
  constexpr int64_t V = 16 / sizeof(T);
  int64_t head = (int64_t)((16 - reinterpret_cast<uintptr_t>(x) % 16) % 16) / (int64_t)sizeof(T);
  head = head < n ? head : n;
  bool vector_stores = reinterpret_cast<uintptr_t>(y + head) % 16 == 0;
  gelu_fwd_vec<T><<<blocks_for((n - head) / V + 1), 256, 0, stream>>>(x, y, n, head, vector_stores);
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch_forward<T>((const T*)a->x.data, (T*)a->out.data, n, stream));
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
