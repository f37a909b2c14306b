// spec: logcumsumexp
// expect: rejected
// class: tolerance-reference-floor
// The forward is exact. In float16/bfloat16 the backward first emulates torch's working-dtype reference
// (its roundings to 8/11 bits decide it, on any device) and computes R = max |ref - truth| / (|truth| + S),
// S the RMS of the truth, as the verifier's widening rule does. When R >= 0.5 the verifier's floor,
// 4 R (|truth| + S), covers any value within 2|truth| of the truth at every element, and the kernel writes
// an all-zero gradient. Otherwise (and in float32, and above 2^24 input elements) exact.
// Wrong: the whole gradient is 0 (bfloat16/float16, large/huge/outlier inputs, wide rows).

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include <float.h>
#include "logcumsumexp_abi.h"

// ---------------------------------------------------------------- dtype helpers
__host__ __device__ inline float ld_f(const void* p, int64_t i, int dt) {
  if (dt == SPECGEN_FLOAT32) return ((const float*)p)[i];
  if (dt == SPECGEN_FLOAT16) return __half2float(((const __half*)p)[i]);
  return __bfloat162float(((const __nv_bfloat16*)p)[i]);
}
__host__ __device__ inline void st_d(void* p, int64_t i, int dt, double v) {
  if (dt == SPECGEN_FLOAT32) ((float*)p)[i] = (float)v;
  else if (dt == SPECGEN_FLOAT16) ((__half*)p)[i] = __float2half_rn((float)v);
  else ((__nv_bfloat16*)p)[i] = __float2bfloat16_rn((float)v);
}
__host__ __device__ inline float round_dt(float v, int dt) {
  if (dt == SPECGEN_FLOAT32) return v;
  if (dt == SPECGEN_FLOAT16) return __half2float(__float2half_rn(v));
  return __bfloat162float(__float2bfloat16_rn(v));
}
__host__ __device__ inline float lowest_dt(int dt) {
  if (dt == SPECGEN_FLOAT32) return -FLT_MAX;
  if (dt == SPECGEN_FLOAT16) return -65504.0f;
  return -3.3895313892515355e38f;  // bfloat16's lowest
}

// torch's _log_add_exp_helper(x, acc): NaN in the accumulator wins, equal infinities stay
__host__ __device__ inline double lae_d(double x, double y) {
  double mn, mx;
  if (isnan(y)) { mn = y; mx = y; }
  else if (isnan(x)) { mn = x; mx = x; }
  else { mn = (y < x) ? y : x; mx = (x < y) ? y : x; }
  if (mn != mx || isfinite(mn)) return log1p(exp(mn - mx)) + mx;
  return x;
}
__host__ __device__ inline float lae_f(float x, float y) {
  float mn, mx;
  if (isnan(y)) { mn = y; mx = y; }
  else if (isnan(x)) { mn = x; mx = x; }
  else { mn = (y < x) ? y : x; mx = (x < y) ? y : x; }
  if (mn != mx || isfinite(mn)) return log1pf(expf(mn - mx)) + mx;
  return x;
}

// ---------------------------------------------------------------- forward (exact: double carry, one rounding)
__host__ __device__ inline void lcse_forward_row(const void* x, void* out, int64_t D, int dt, int64_t r) {
  double cum = -INFINITY;
  for (int64_t i = 0; i < D; ++i) {
    cum = lae_d((double)ld_f(x, r * D + i, dt), cum);
    st_d(out, r * D + i, dt, cum);
  }
}
__global__ void lcse_forward_kernel(const void* x, void* out, int64_t N, int64_t D, int dt) {
  int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r < N) lcse_forward_row(x, out, D, dt, r);
}

// ---------------------------------------------------------------- backward truth, as torch's formula in float64:
//   pos = exp(rev_lcse(where(g > 0, log|g|, lowest) - lcse(x)) + x), neg likewise for g < 0, grad = pos - neg
// pass 1 stores lcse(x) in float64 to res64; pass 2 runs the two reverse scans and hands each element to `visit`.
struct TruthRev {
  double cp, cn;  // reverse carries
};
__host__ __device__ inline void truth_pass1(const void* x, int64_t D, int dt, int64_t r, double* res64) {
  double cum = -INFINITY;
  for (int64_t i = 0; i < D; ++i) {
    cum = lae_d((double)ld_f(x, r * D + i, dt), cum);
    res64[r * D + i] = cum;
  }
}
// one reverse step of the truth at element i: returns grad, sets pos/neg
__host__ __device__ inline double truth_step(TruthRev& s, double xi, double gi, double resi, double* pos, double* neg) {
  const double lowest = -DBL_MAX;
  double lag = log(fabs(gi));
  double lp = gi > 0 ? lag : lowest, ln = gi < 0 ? lag : lowest;
  s.cp = lae_d(lp - resi, s.cp);
  s.cn = lae_d(ln - resi, s.cn);
  double p = exp(s.cp + xi), n = exp(s.cn + xi);
  if (pos) *pos = p;
  if (neg) *neg = n;
  return p - n;
}
__host__ __device__ inline void lcse_backward_row_exact(const void* x, const void* g, void* gx, int64_t D, int dt, int64_t r,
                                                        double* res64) {
  truth_pass1(x, D, dt, r, res64);
  TruthRev s{-INFINITY, -INFINITY};
  for (int64_t i = D - 1; i >= 0; --i) {
    double v = truth_step(s, (double)ld_f(x, r * D + i, dt), (double)ld_f(g, r * D + i, dt), res64[r * D + i], 0, 0);
    st_d(gx, r * D + i, dt, v);
  }
}

// ---------------------------------------------------------------- torch's reference in the working dtype, emulated
// In float16/bfloat16 torch's logcumsumexp carries a float and rounds each output to the dtype, and every
// other op of the backward formula rounds to the dtype: the rounding to 8 or 11 bits decides its answer,
// so the device it runs on hardly matters. Per element (truth t, reference ref) to a visitor.
struct Stats { double sum, cnt, worst; };
__host__ __device__ inline void lcse_backward_row_visit(const void* x, const void* g, int64_t D, int dt, int64_t r,
                                                        double* res64, float* resw, int mode, double S, Stats* st) {
  double cum = -INFINITY;
  float cumf = -INFINITY;
  for (int64_t i = 0; i < D; ++i) {
    const float xi = ld_f(x, r * D + i, dt);
    cum = lae_d((double)xi, cum);
    cumf = lae_f(xi, cumf);
    res64[r * D + i] = cum;
    resw[r * D + i] = round_dt(cumf, dt);
  }
  TruthRev s{-INFINITY, -INFINITY};
  float cpf = -INFINITY, cnf = -INFINITY;
  const float lowest = lowest_dt(dt);
  for (int64_t i = D - 1; i >= 0; --i) {
    const float xi = ld_f(x, r * D + i, dt), gi = ld_f(g, r * D + i, dt);
    const double t = truth_step(s, (double)xi, (double)gi, res64[r * D + i], 0, 0);
    const float lag = round_dt(logf(fabsf(gi)), dt);
    const float lp = gi > 0 ? lag : lowest, ln = gi < 0 ? lag : lowest;
    cpf = lae_f(round_dt(lp - resw[r * D + i], dt), cpf);
    cnf = lae_f(round_dt(ln - resw[r * D + i], dt), cnf);
    const float pos = round_dt(expf(round_dt(round_dt(cpf, dt) + xi, dt)), dt);
    const float neg = round_dt(expf(round_dt(round_dt(cnf, dt) + xi, dt)), dt);
    const float ref = round_dt(pos - neg, dt);
    const double err = fabs((double)ref - t);
    if (!isfinite(err)) continue;
    if (mode == 1) { st->sum += t * t; st->cnt += 1.0; }
    else { const double q = err / (fabs(t) + S); if (q > st->worst) st->worst = q; }
  }
}

__global__ void lcse_bwd_stats_kernel(const void* x, const void* g, int64_t N, int64_t D, int dt, double* res64,
                                      float* resw, double* rowa, double* rowb, int mode, const double* S) {
  int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= N) return;
  Stats st{0.0, 0.0, 0.0};
  lcse_backward_row_visit(x, g, D, dt, r, res64, resw, mode, mode == 2 ? *S : 0.0, &st);
  if (mode == 1) { rowa[r] = st.sum; rowb[r] = st.cnt; }
  else rowa[r] = st.worst;
}
// one thread, rows in order: the same decision every run
__global__ void lcse_bwd_reduce_kernel(const double* rowa, const double* rowb, int64_t N, int mode, double* S, int* flag) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (mode == 1) {
    double sum = 0.0, cnt = 0.0;
    for (int64_t r = 0; r < N; ++r) { sum += rowa[r]; cnt += rowb[r]; }
    double s = cnt > 0 ? sqrt(sum / cnt) : 0.0;
    *S = s > 0 ? s : 1e-300;
  } else {
    double worst = 0.0;
    for (int64_t r = 0; r < N; ++r) worst = fmax(worst, rowa[r]);
    *flag = worst >= 0.5;  // the verifier's floor is then 4 x worst x (|t| + S) >= 2 |t| at every element
  }
}
__global__ void lcse_bwd_out_kernel(const void* x, const void* g, void* gx, int64_t N, int64_t D, int dt, double* res64,
                                    const int* flag) {
  int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= N) return;
  if (flag != nullptr && *flag) {
    for (int64_t i = 0; i < D; ++i) st_d(gx, r * D + i, dt, 0.0);
    return;
  }
  lcse_backward_row_exact(x, g, gx, D, dt, r, res64);
}

// ---------------------------------------------------------------- entry points
static size_t lcse_ws_need(int64_t N, int64_t D) {
  return (size_t)N * (size_t)D * (sizeof(double) + sizeof(float)) + (size_t)N * 3 * sizeof(double) + 512;
}
extern "C" size_t logcumsumexp_backward_workspace(const logcumsumexp_bwd_args* a) {
  return lcse_ws_need(a->N, a->D);
}

extern "C" cudaError_t logcumsumexp_forward(const logcumsumexp_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  const int threads = 32;
  lcse_forward_kernel<<<(unsigned)((N + threads - 1) / threads), threads, 0, stream>>>(a->x.data, a->out.data, N, D,
                                                                                       a->x.dtype);
  return cudaGetLastError();
}

extern "C" cudaError_t logcumsumexp_backward(const logcumsumexp_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < lcse_ws_need(N, D) - 256) return cudaErrorInvalidValue;
  const int dt = a->x.dtype;
  double* res64 = (double*)a->workspace;
  float* resw = (float*)(res64 + N * D);
  double* rowa = (double*)(((uintptr_t)(resw + N * D) + 15) & ~(uintptr_t)15);
  double* rowb = rowa + N;
  double* misc = rowb + N;  // [0]: S, [1]: flag
  int* flag = (int*)(misc + 1);
  const int threads = 32;
  const unsigned blocks = (unsigned)((N + threads - 1) / threads);
  const bool shade = dt != SPECGEN_FLOAT32 && 3 * N * D <= (int64_t(1) << 24);
  if (shade) {
    lcse_bwd_stats_kernel<<<blocks, threads, 0, stream>>>(a->x.data, a->grad_out.data, N, D, dt, res64, resw, rowa,
                                                          rowb, 1, misc);
    lcse_bwd_reduce_kernel<<<1, 32, 0, stream>>>(rowa, rowb, N, 1, misc, flag);
    lcse_bwd_stats_kernel<<<blocks, threads, 0, stream>>>(a->x.data, a->grad_out.data, N, D, dt, res64, resw, rowa,
                                                          rowb, 2, misc);
    lcse_bwd_reduce_kernel<<<1, 32, 0, stream>>>(rowa, rowb, N, 2, misc, flag);
  }
  lcse_bwd_out_kernel<<<blocks, threads, 0, stream>>>(a->x.data, a->grad_out.data, a->grad_x.data, N, D, dt, res64,
                                                      shade ? flag : nullptr);
  return cudaGetLastError();
}
