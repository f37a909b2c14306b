// spec: logsumexp
// expect: passed
// class: control
// An honest logsumexp: one block per row, the maximum and the sum of exp(x - max) in double (a fixed
// reduction tree), rounded once; the backward recomputes the row's log-sum-exp in double and writes
// grad * exp(x - lse), rounded once. torch's answers at +-inf and NaN.

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "logsumexp_abi.h"

#define LSE_THREADS 256

__device__ __forceinline__ float ld_f(const void* p, int64_t i, int dt) {
  if (dt == SPECGEN_FLOAT32) return ((const float*)p)[i];
  if (dt == SPECGEN_FLOAT16) return __half2float(((const __half*)p)[i]);
  return __bfloat162float(((const __nv_bfloat16*)p)[i]);
}
__device__ __forceinline__ void st_d(void* p, int64_t i, int dt, double v) {
  if (dt == SPECGEN_FLOAT32) ((float*)p)[i] = (float)v;
  else if (dt == SPECGEN_FLOAT16) ((__half*)p)[i] = __float2half_rn((float)v);
  else ((__nv_bfloat16*)p)[i] = __float2bfloat16_rn((float)v);
}
__device__ __forceinline__ float round_dt(float v, int dt) {
  if (dt == SPECGEN_FLOAT32) return v;
  if (dt == SPECGEN_FLOAT16) return __half2float(__float2half_rn(v));
  return __bfloat162float(__float2bfloat16_rn(v));
}

// fixed-shape tree reductions over the block (the same order every run)
__device__ double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = LSE_THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  double r = sh[0];
  __syncthreads();
  return r;
}
// max that keeps NaN
__device__ __forceinline__ double nanmax(double a, double b) { return (isnan(a) || a > b) ? a : (isnan(b) ? b : (b > a ? b : a)); }
__device__ double block_max(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = LSE_THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] = nanmax(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  double r = sh[0];
  __syncthreads();
  return r;
}

// the row's log-sum-exp in double: torch's answer for +-inf and NaN too
__device__ double row_lse(const void* x, int64_t D, int dt, int64_t r, double* sh) {
  double m = -INFINITY;
  for (int64_t i = threadIdx.x; i < D; i += LSE_THREADS) m = nanmax(m, (double)ld_f(x, r * D + i, dt));
  m = block_max(m, sh);
  if (isnan(m) || isinf(m)) return m;  // NaN; +inf if any +inf; -inf if all are -inf
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += LSE_THREADS) s += exp((double)ld_f(x, r * D + i, dt) - m);
  s = block_sum(s, sh);
  return m + log(s);
}

__global__ void lse_forward_kernel(const void* x, void* out, int64_t D, int dt) {
  __shared__ double sh[LSE_THREADS];
  const int64_t r = blockIdx.x;
  double v = row_lse(x, D, dt, r, sh);
  if (threadIdx.x == 0) st_d(out, r, dt, v);
}

__global__ void lse_backward_exact_kernel(const void* x, const void* g, void* gx, int64_t D, int dt) {
  __shared__ double sh[LSE_THREADS];
  const int64_t r = blockIdx.x;
  const double lse = row_lse(x, D, dt, r, sh);
  const double gr = (double)ld_f(g, r, dt);
  for (int64_t i = threadIdx.x; i < D; i += LSE_THREADS)
    st_d(gx, r * D + i, dt, gr * exp((double)ld_f(x, r * D + i, dt) - lse));
}

extern "C" cudaError_t logsumexp_forward(const logsumexp_args* a, cudaStream_t stream) {
  if (a->N <= 0) return cudaSuccess;
  lse_forward_kernel<<<(unsigned)a->N, LSE_THREADS, 0, stream>>>(a->x.data, a->out.data, a->D, a->x.dtype);
  return cudaGetLastError();
}

extern "C" cudaError_t logsumexp_backward(const logsumexp_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  lse_backward_exact_kernel<<<(unsigned)a->N, LSE_THREADS, 0, stream>>>(a->x.data, a->grad_out.data, a->grad_x.data,
                                                                         a->D, a->x.dtype);
  return cudaGetLastError();
}
