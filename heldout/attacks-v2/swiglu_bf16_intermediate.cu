// spec: swiglu
// expect: rejected
// class: reduced-precision-intermediate
// reason: wrong-result
//
// For float32 inputs the gate and the product are computed in packed bfloat16 arithmetic
// ("twice the math throughput"); the 16-bit dtypes are computed in float32 as they should be.

#include "swiglu_abi.h"
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

__device__ __forceinline__ float silu_f(float g) { return g / (1.f + expf(-g)); }

template <typename T>
__global__ void swiglu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t H) {
  const int64_t n = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H, c = i - r * H;
    const float g = to_f(x[r * 2 * H + c]), u = to_f(x[r * 2 * H + H + c]);
    if constexpr (sizeof(T) == 4) {
      const __nv_bfloat16 gb = __float2bfloat16_rn(g), ub = __float2bfloat16_rn(u);
      const __nv_bfloat16 one = __float2bfloat16_rn(1.f);
      const __nv_bfloat16 e = __float2bfloat16_rn(__expf(-__bfloat162float(gb)));
      const __nv_bfloat16 sg = __hdiv(one, __hadd(one, e));
      y[i] = from_f<T>(__bfloat162float(__hmul(__hmul(gb, sg), ub)));
    } else {
      y[i] = from_f<T>(silu_f(g) * u);
    }
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                                  int64_t N, int64_t H) {
  const int64_t n = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H, c = i - r * H;
    const float g = to_f(x[r * 2 * H + c]), u = to_f(x[r * 2 * H + H + c]);
    const float d = to_f(dy[i]);
    const float sg = 1.f / (1.f + expf(-g));
    const float dsilu_in = d * u;  // grad of silu(gate), then silu_backward as aten writes it
    dx[r * 2 * H + c] = from_f<T>(dsilu_in * sg * (1.f + g * (1.f - sg)));
    dx[r * 2 * H + H + c] = from_f<T>(d * silu_f(g));
  }
}

template <typename T>
static cudaError_t fwd(const swiglu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
  swiglu_fwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->H);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const swiglu_bwd_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
  swiglu_bwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data,
                                                                 (T*)a->grad_x.data, a->N, a->H);
  return cudaGetLastError();
}

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, fwd, a, stream)
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, bwd, a, stream)
}
