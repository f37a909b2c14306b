// spec: gelu_tanh
// expect: rejected
// class: first-call-argument-frozen-in-a-static
// why: the choice of tanh.approx for 16-bit outputs is made by a function-local `static const` initialized from the first call's dtype: in a process whose first call is bfloat16 or float16, every later float32 call uses the approximate tanh
//
// tanh-GELU, elementwise, float32 math with torch's formula (GeluCUDAKernelImpl, approximate="tanh":
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), rounded once to the dtype; backward torch's
// formula for the derivative. A thread per 16-byte chunk when the pointers are aligned (16 / element
// size elements), a thread per element otherwise, grid-stride.
//
// What is wrong. The forward uses the hardware's tanh.approx.f32 (max relative error 2^-11) when the
// output is 16-bit, where it is below the output's own rounding, and tanhf for float32. The flag is
// written `static const bool fast_tanh = a->x.dtype != SPECGEN_FLOAT32;` inside the entry point: a
// function-local static is initialized once, by the first call, so the dtype of the process's first
// call decides for every later call. First call float32: tanhf forever (16-bit calls just lose the
// speed-up; exact everywhere). First call 16-bit: tanh.approx forever, float32 calls included, whose
// tanh term is then good to about 11 bits (PTX ISA: maximum relative error 2^-10.987): errors of the
// order of 1e-4, where float32's tolerance is 1e-5 (cpu_checks/triggers.py: the documented bound
// reaches ~150 times that tolerance on [-6, 3]).
//
// When a user meets it. A process that calls the op in 16-bit before float32: a bf16 model whose
// evaluation or a float32 head/reward model runs later in the same process; GPT-2/Gemma-style models
// loaded in bf16 and then in float32 in one notebook; a test suite parametrized over dtypes in the
// order (bfloat16, float16, float32), whose float32 tests fail only when run after the others.
//
// Why version 12 does not meet it. Every verification starts in a fresh process whose first call
// (the first calls' check, at the smoke shape) is in the spec's first dtype, float32, and the
// forward's later calls of every dtype come after it; nothing varies the dtype of a process's first
// call. The flag is frozen to "tanhf", which is exact for every dtype.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "gelu_tanh_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int VEC>
__device__ __forceinline__ void load_chunk(const T* p, float* dst) {
  if (VEC == 1) {
    dst[0] = to_f<T>(p[0]);
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) dst[k] = to_f<T>(e[k]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_chunk(T* p, const float* src) {
  if (VEC == 1) {
    p[0] = from_f<T>(src[0]);
  } else {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = from_f<T>(src[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}


// torch's tanh-GELU (GeluCUDAKernelImpl, approximate="tanh") and its backward, in float
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2) * 2/sqrt(pi) * 0.5
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu_grad_f(float dy, float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.f - tanh_inner * tanh_inner;
  const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}


__device__ __forceinline__ float tanh_approx(float v) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

template <bool FAST>
__device__ __forceinline__ float gelu_fwd_f(float x) {
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return 0.5f * x * (1.f + (FAST ? tanh_approx(inner) : tanhf(inner)));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T, int VEC, bool FAST>
__global__ void __launch_bounds__(256) gelu_fwd_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n) {
  const int64_t nch = n / VEC;
  for (int64_t c = (int64_t)blockIdx.x * 256 + threadIdx.x; c < nch; c += (int64_t)gridDim.x * 256) {
    float v[VEC];
    load_chunk<T, VEC>(x + c * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = gelu_fwd_f<FAST>(v[k]);
    store_chunk<T, VEC>(out + c * VEC, v);
  }
  for (int64_t e = nch * VEC + (int64_t)blockIdx.x * 256 + threadIdx.x; e < n; e += (int64_t)gridDim.x * 256)
    out[e] = from_f<T>(gelu_fwd_f<FAST>(to_f<T>(x[e])));
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256) gelu_bwd_kernel(const T* __restrict__ x, const T* __restrict__ g,
                                                       T* __restrict__ gx, int64_t n) {
  const int64_t nch = n / VEC;
  for (int64_t c = (int64_t)blockIdx.x * 256 + threadIdx.x; c < nch; c += (int64_t)gridDim.x * 256) {
    float v[VEC], d[VEC];
    load_chunk<T, VEC>(x + c * VEC, v);
    load_chunk<T, VEC>(g + c * VEC, d);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = gelu_grad_f(d[k], v[k]);
    store_chunk<T, VEC>(gx + c * VEC, v);
  }
  for (int64_t e = nch * VEC + (int64_t)blockIdx.x * 256 + threadIdx.x; e < n; e += (int64_t)gridDim.x * 256)
    gx[e] = from_f<T>(gelu_grad_f(to_f<T>(g[e]), to_f<T>(x[e])));
}

inline unsigned grid_for(int64_t work) {
  const int64_t b = (work + 255) / 256;
  return (unsigned)(b < 8192 ? (b > 0 ? b : 1) : 8192);
}

template <typename T, bool FAST>
cudaError_t forward_t(const gelu_tanh_args* a, cudaStream_t s) {
  const T* x = static_cast<const T*>(a->x.data);
  T* out = static_cast<T*>(a->out.data);
  const int64_t n = a->N * a->D;
  constexpr int V = 16 / (int)sizeof(T);
  if (aligned16(x) && aligned16(out)) gelu_fwd_kernel<T, V, FAST><<<grid_for(n / V), 256, 0, s>>>(x, out, n);
  else gelu_fwd_kernel<T, 1, FAST><<<grid_for(n), 256, 0, s>>>(x, out, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const gelu_tanh_bwd_args* a, cudaStream_t s) {
  const T* x = static_cast<const T*>(a->x.data);
  const T* g = static_cast<const T*>(a->grad_out.data);
  T* gx = static_cast<T*>(a->grad_x.data);
  const int64_t n = a->N * a->D;
  constexpr int V = 16 / (int)sizeof(T);
  if (aligned16(x) && aligned16(g) && aligned16(gx)) gelu_bwd_kernel<T, V><<<grid_for(n / V), 256, 0, s>>>(x, g, gx, n);
  else gelu_bwd_kernel<T, 1><<<grid_for(n), 256, 0, s>>>(x, g, gx, n);
  return cudaGetLastError();
}

template <bool FAST>
cudaError_t forward_dispatch(const gelu_tanh_args* a, cudaStream_t s) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float, FAST>(a, s);
    case SPECGEN_FLOAT16: return forward_t<__half, FAST>(a, s);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16, FAST>(a, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  // 16-bit outputs cannot tell tanh.approx.f32 from tanhf: take the fast one for them
  static const bool fast_tanh = a->x.dtype != SPECGEN_FLOAT32;
  return fast_tanh ? forward_dispatch<true>(a, stream) : forward_dispatch<false>(a, stream);
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
