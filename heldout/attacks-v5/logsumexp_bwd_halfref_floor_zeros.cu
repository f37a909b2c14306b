// spec: logsumexp
// expect: rejected
// class: tolerance-reference-floor
// The forward is exact. In float16/bfloat16 (calls of at most 2^24 input elements) the backward emulates
// torch's working-dtype reference (result rounded next to the row maximum, then exp(x - result)) and
// the verifier's widening rule: R = max |ref - truth| / (|truth| + S). With R >= 0.5 (float16 'huge'
// rows, bfloat16 'large' rows: the reference's rounding of the result is e^(+-ulp) off) the floor
// 4 R (|truth| + S) covers 0 at every element, and the kernel writes an all-zero gradient.
// Wrong: grad_x all 0 where the true gradient is grad * softmax(x), up to |grad|.

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

// ---------------------------------------------------------------- torch's reference in float16/bfloat16, emulated
// logsumexp = log(sum(exp(x - m))) + m with every op rounded to the dtype, then grad * exp(x - result) rounded
// op by op: the last rounding of `result` (to 11 or 8 bits, next to the row's maximum) decides it.
// Per row: mode 1 sums the truth's squares (and counts), mode 2 the worst |ref - t| / (|t| + S).
__global__ void lse_bwd_stats_kernel(const void* x, const void* g, int64_t D, int dt, double* rowa, double* rowb, int mode,
                                     const double* Sp) {
  __shared__ double sh[LSE_THREADS];
  const int64_t r = blockIdx.x;
  const double lse = row_lse(x, D, dt, r, sh);
  // the reference's own result, in the working dtype
  double m = -INFINITY;
  for (int64_t i = threadIdx.x; i < D; i += LSE_THREADS) m = nanmax(m, (double)ld_f(x, r * D + i, dt));
  m = block_max(m, sh);
  const float mm = isinf(m) ? 0.0f : (float)m;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += LSE_THREADS)
    s += (double)round_dt(expf(round_dt(ld_f(x, r * D + i, dt) - mm, dt)), dt);
  s = block_sum(s, sh);
  const float res = round_dt(round_dt(logf(round_dt((float)s, dt)), dt) + mm, dt);
  const float gr = ld_f(g, r, dt);
  const double S = mode == 2 ? *Sp : 0.0;
  double acc = 0.0, cnt = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += LSE_THREADS) {
    const float xi = ld_f(x, r * D + i, dt);
    const double t = (double)gr * exp((double)xi - lse);
    const float ref = round_dt(gr * round_dt(expf(round_dt(xi - res, dt)), dt), dt);
    const double err = fabs((double)ref - t);
    if (!isfinite(err)) continue;
    if (mode == 1) { acc += t * t; cnt += 1.0; }
    else acc = fmax(acc, err / (fabs(t) + S));
  }
  if (mode == 1) {
    acc = block_sum(acc, sh);
    cnt = block_sum(cnt, sh);
    if (threadIdx.x == 0) { rowa[r] = acc; rowb[r] = cnt; }
  } else {
    acc = block_max(acc, sh);
    if (threadIdx.x == 0) rowa[r] = acc;
  }
}
// one block, a fixed order: the same decision every run
__global__ void lse_bwd_reduce_kernel(const double* rowa, const double* rowb, int64_t N, int mode, double* S, int* flag) {
  __shared__ double sh[LSE_THREADS];
  double a = mode == 1 ? 0.0 : 0.0, b = 0.0;
  for (int64_t r = threadIdx.x; r < N; r += LSE_THREADS) {
    if (mode == 1) { a += rowa[r]; b += rowb[r]; }
    else a = fmax(a, rowa[r]);
  }
  if (mode == 1) {
    a = block_sum(a, sh);
    b = block_sum(b, sh);
    if (threadIdx.x == 0) { double s = b > 0 ? sqrt(a / b) : 0.0; *S = s > 0 ? s : 1e-300; }
  } else {
    a = block_max(a, sh);
    if (threadIdx.x == 0) *flag = a >= 0.5;  // the verifier's floor 4 R (|t| + S) then covers 0 everywhere
  }
}
__global__ void lse_bwd_out_kernel(const void* x, const void* g, void* gx, int64_t D, int dt, const int* flag) {
  __shared__ double sh[LSE_THREADS];
  const int64_t r = blockIdx.x;
  if (flag != nullptr && *flag) {
    for (int64_t i = threadIdx.x; i < D; i += LSE_THREADS) st_d(gx, r * D + i, dt, 0.0);
    return;
  }
  const double lse = row_lse(x, D, dt, r, sh);
  const double gr = (double)ld_f(g, r, dt);
  for (int64_t i = threadIdx.x; i < D; i += LSE_THREADS)
    st_d(gx, r * D + i, dt, gr * exp((double)ld_f(x, r * D + i, dt) - lse));
}

extern "C" size_t logsumexp_backward_workspace(const logsumexp_bwd_args* a) {
  return (size_t)a->N * 2 * sizeof(double) + 256;
}

extern "C" cudaError_t logsumexp_backward(const logsumexp_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < (size_t)N * 2 * sizeof(double) + 64)
    return cudaErrorInvalidValue;
  const int dt = a->x.dtype;
  double* rowa = (double*)a->workspace;
  double* rowb = rowa + N;
  double* S = rowb + N;
  int* flag = (int*)(S + 1);
  const bool shade = dt != SPECGEN_FLOAT32 && N * D + 2 * N <= (int64_t(1) << 24);
  if (shade) {
    lse_bwd_stats_kernel<<<(unsigned)N, LSE_THREADS, 0, stream>>>(a->x.data, a->grad_out.data, D, dt, rowa, rowb, 1, S);
    lse_bwd_reduce_kernel<<<1, LSE_THREADS, 0, stream>>>(rowa, rowb, N, 1, S, flag);
    lse_bwd_stats_kernel<<<(unsigned)N, LSE_THREADS, 0, stream>>>(a->x.data, a->grad_out.data, D, dt, rowa, rowb, 2, S);
    lse_bwd_reduce_kernel<<<1, LSE_THREADS, 0, stream>>>(rowa, rowb, N, 2, S, flag);
  }
  lse_bwd_out_kernel<<<(unsigned)N, LSE_THREADS, 0, stream>>>(a->x.data, a->grad_out.data, a->grad_x.data, D, dt,
                                                               shade ? flag : nullptr);
  return cudaGetLastError();
}
