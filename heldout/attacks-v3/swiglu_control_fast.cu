// spec: swiglu
// expect: passed
// class: control-fast-vectorized
// why: honest: 16-byte vector loads of the gate and up halves when the row layout allows, a scalar path otherwise

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "swiglu_abi.h"

__device__ __forceinline__ float ldf(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ldf(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ldf(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void stf(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stf(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void stf(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// Block-wide sum / max over blockDim.x threads (a multiple of 32); every thread gets the result.
template <bool MAX>
__device__ float block_reduce(float v) {
  __shared__ float sh[33];
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  if (wid == 0) {
    v = lane < nw ? sh[lane] : (MAX ? -INFINITY : 0.f);
    for (int o = 16; o > 0; o >>= 1) {
      float w = __shfl_xor_sync(0xffffffffu, v, o);
      v = MAX ? fmaxf(v, w) : v + w;
    }
    if (lane == 0) sh[32] = v;
  }
  __syncthreads();
  return sh[32];
}

__attribute__((unused)) static inline int grid_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  if (b < 1) b = 1;
  if (b > 262144) b = 262144;
  return (int)b;
}

#define DISPATCH(dt, ...)                                                       \
  switch (dt) {                                                                 \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; break; }             \
    case SPECGEN_FLOAT16: { typedef __half T; __VA_ARGS__; break; }            \
    case SPECGEN_BFLOAT16: { typedef __nv_bfloat16 T; __VA_ARGS__; break; }    \
    default: return cudaErrorInvalidValue;                                      \
  }

__device__ __forceinline__ float silu_f(float a) { return a / (1.f + expf(-a)); }
__device__ __forceinline__ float silu_grad_f(float a) {
  float s = 1.f / (1.f + expf(-a));
  return s * (1.f + a * (1.f - s));
}

template <typename T>
__global__ void swiglu_fwd_k(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t H) {
  int64_t n = N * H;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / H, c = i - r * H;
    float gate = ldf(x, r * 2 * H + c), up = ldf(x, r * 2 * H + H + c);
    stf(y, i, silu_f(gate) * up);
  }
}

template <typename T>
__global__ void swiglu_bwd_k(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t N, int64_t H) {
  int64_t n = N * H;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / H, c = i - r * H;
    float gate = ldf(x, r * 2 * H + c), up = ldf(x, r * 2 * H + H + c), dy = ldf(g, i);
    stf(gx, r * 2 * H + c, dy * up * silu_grad_f(gate));
    stf(gx, r * 2 * H + H + c, dy * silu_f(gate));
  }
}


// 16-byte vector path when each row's halves start on 16-byte boundaries (H % V == 0, aligned pointers).
template <typename T>
__global__ void swiglu_fwd_vec_k(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t H) {
  constexpr int V = 16 / sizeof(T);
  int64_t hv = H / V, nv = N * hv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / hv, c = i - r * hv;
    alignas(16) T ga[V];
    alignas(16) T up[V];
    alignas(16) T o[V];
    *(uint4*)ga = __ldg((const uint4*)(x + r * 2 * H) + c);
    *(uint4*)up = __ldg((const uint4*)(x + r * 2 * H + H) + c);
#pragma unroll
    for (int k = 0; k < V; ++k) stf(o, k, silu_f(ldf(ga, k)) * ldf(up, k));
    ((uint4*)(y + r * H))[c] = *(uint4*)o;
  }
}
static inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->H;
  DISPATCH(a->x.dtype,
    if (aligned16(a->x.data) && aligned16(a->out.data) && a->H % (16 / (int64_t)sizeof(T)) == 0)
      swiglu_fwd_vec_k<T><<<grid_for(n / (16 / (int64_t)sizeof(T))), 256, 0, stream>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->H);
    else
      swiglu_fwd_k<T><<<grid_for(n), 256, 0, stream>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->H));
  return cudaGetLastError();
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  int64_t n = a->N * a->H;
  DISPATCH(a->x.dtype, swiglu_bwd_k<T><<<grid_for(n), 256, 0, stream>>>((const T*)a->x.data, (const T*)a->grad_out.data,
                                                                        (T*)a->grad_x.data, a->N, a->H));
  return cudaGetLastError();
}
