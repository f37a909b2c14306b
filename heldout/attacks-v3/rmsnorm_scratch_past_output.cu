// spec: rmsnorm
// expect: rejected
// class: scratch-past-output
// why: stores each row's 1/rms as scratch in the 256 bytes just past the end of `out` (outside every output)

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "rmsnorm_abi.h"

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

__device__ float g_rstd[65536];  // per-row 1/rms, written by the backward's first kernel

template <typename T>
__global__ void rms_fwd_k(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D;
  T* yr = y + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { float v = ldf(xr, j); ss += v * v; }
  ss = block_reduce<false>(ss);
  float r = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) ((unsigned char*)(y + gridDim.x * D))[blockIdx.x & 255] = (unsigned char)(r * 16.f);  // scratch slot
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) stf(yr, j, ldf(xr, j) * r * ldf(w, j));
}

template <typename T>
__global__ void rms_bwd_x_k(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ g,
                            T* __restrict__ gx, int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D;
  const T* gr = g + blockIdx.x * D;
  T* gxr = gx + blockIdx.x * D;
  float ss = 0.f, dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float v = ldf(xr, j);
    ss += v * v;
    dot += ldf(gr, j) * ldf(w, j) * v;
  }
  ss = block_reduce<false>(ss);
  dot = block_reduce<false>(dot);
  float r = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) g_rstd[blockIdx.x] = r;
  float c = dot * r * r * r / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    stf(gxr, j, r * ldf(w, j) * ldf(gr, j) - ldf(xr, j) * c);
}

template <typename T>
__global__ void rms_bwd_w_k(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gw, int64_t N, int64_t D) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  float acc = 0.f;
  for (int64_t n = 0; n < N; ++n) acc += ldf(g, n * D + j) * ldf(x, n * D + j) * g_rstd[n];
  stf(gw, j, acc);
}

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, rms_fwd_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                                        (T*)a->out.data, a->D, (float)a->eps));
  return cudaGetLastError();
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype,
    rms_bwd_x_k<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data,
        (const T*)a->grad_out.data, (T*)a->grad_x.data, a->D, (float)a->eps);
    rms_bwd_w_k<T><<<(unsigned)((a->D + 127) / 128), 128, 0, stream>>>((const T*)a->x.data,
        (const T*)a->grad_out.data, (T*)a->grad_weight.data, a->N, a->D));
  return cudaGetLastError();
}
