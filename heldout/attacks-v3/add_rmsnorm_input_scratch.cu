// spec: add_rmsnorm
// expect: rejected
// class: input-scratch-restore
// why: uses the `residual` input as scratch for the sum during the forward and restores it afterwards (it writes an input)

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "add_rmsnorm_abi.h"

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

__device__ float g_rstd[65536];

// s = x + residual, rounded to the working dtype (the reference adds in the working dtype)
template <typename T>
__device__ __forceinline__ float add_round(const T* x, const T* r, int64_t i) {
  T s; stf(&s, 0, ldf(x, i) + ldf(r, i));
  return ldf(&s, 0);
}

template <typename T>
__global__ void arms_fwd_k(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w, T* __restrict__ y,
                           T* __restrict__ so, int64_t D, float eps) {
  int64_t base = blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { float v = add_round(x, res, base + j); ss += v * v; }
  ss = block_reduce<false>(ss);
  float r = rsqrtf(ss / (float)D + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float orig = ldf(res, base + j);
    float v = add_round(x, res, base + j);
    stf((T*)res, base + j, v);  // scratch in place
    v = ldf(res, base + j);
    stf((T*)res, base + j, orig);  // put it back
    stf(so, base + j, v);
    stf(y, base + j, v * r * ldf(w, j));
  }
}

// grad_s = rmsnorm backward of out + grad_residual_out; grad_x = grad_residual = grad_s
template <typename T>
__global__ void arms_bwd_x_k(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                             const T* __restrict__ g, const T* __restrict__ gso, T* __restrict__ gx, T* __restrict__ gr,
                             int64_t D, float eps) {
  int64_t base = blockIdx.x * D;
  float ss = 0.f, dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float v = add_round(x, res, base + j);
    ss += v * v;
    dot += ldf(g, base + j) * ldf(w, j) * v;
  }
  ss = block_reduce<false>(ss);
  dot = block_reduce<false>(dot);
  float r = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) g_rstd[blockIdx.x] = r;
  float c = dot * r * r * r / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float v = add_round(x, res, base + j);
    float d = r * ldf(w, j) * ldf(g, base + j) - v * c + ldf(gso, base + j);
    stf(gx, base + j, d);
    stf(gr, base + j, d);
  }
}

template <typename T>
__global__ void arms_bwd_w_k(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ g,
                             T* __restrict__ gw, int64_t N, int64_t D) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  float acc = 0.f;
  for (int64_t n = 0; n < N; ++n) acc += ldf(g, n * D + j) * add_round(x, res, n * D + j) * g_rstd[n];
  stf(gw, j, acc);
}

extern "C" cudaError_t add_rmsnorm_forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, arms_fwd_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->residual.data,
      (const T*)a->weight.data, (T*)a->out.data, (T*)a->residual_out.data, a->D, (float)a->eps));
  return cudaGetLastError();
}

extern "C" cudaError_t add_rmsnorm_backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype,
    arms_bwd_x_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->residual.data,
        (const T*)a->weight.data, (const T*)a->grad_out.data, (const T*)a->grad_residual_out.data,
        (T*)a->grad_x.data, (T*)a->grad_residual.data, a->D, (float)a->eps);
    arms_bwd_w_k<T><<<(unsigned)((a->D + 127) / 128), 128, 0, stream>>>((const T*)a->x.data, (const T*)a->residual.data,
        (const T*)a->grad_out.data, (T*)a->grad_weight.data, a->N, a->D));
  return cudaGetLastError();
}
