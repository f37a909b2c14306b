// spec: logcumsumexp
// expect: rejected
// class: tolerance-cpu-reference
// The forward is exact. The float32 backward, on calls small enough for the verifier to ask the CPU
// (x, out and grad_out together at most 2^24 elements), emulates torch's CPU float32 answer element by
// element (the CPU's logcumsumexp carries a double and rounds each output; every other op of the formula
// rounds to float) and, where that answer is far off the truth, writes 0 (CPU error >= 55% of |truth|) or
// a value 1.9x as far off as the CPU's, on the same side. Exact everywhere else, and in float16/bfloat16.
// Wrong: zero gradients where the true gradient is O(1)-O(10), at |x| >~ 1e3.

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

// ---------------------------------------------------------------- torch's CPU reference in float32, emulated
// The CPU's logcumsumexp carries a double and rounds each output to float; every other op of the
// backward formula rounds to float. Pass 1 stores the CPU's forward (float) beside the truth's.
__host__ __device__ inline double ulp32(double v) {
  float f = fabsf((float)v);
  if (!isfinite(f)) return INFINITY;
  return (double)nextafterf(f, INFINITY) - (double)f;
}
__host__ __device__ inline void lcse_backward_row_shaded(const void* x, const void* g, void* gx, int64_t D, int dt,
                                                         int64_t r, double* res64, float* rescpu) {
  double cum = -INFINITY;
  for (int64_t i = 0; i < D; ++i) {
    cum = lae_d((double)ld_f(x, r * D + i, dt), cum);
    res64[r * D + i] = cum;
    rescpu[r * D + i] = (float)cum;
  }
  TruthRev s{-INFINITY, -INFINITY};
  double cpc = -INFINITY, cnc = -INFINITY;  // the CPU's reverse carries (double, rounded per output)
  const float lowest = -FLT_MAX;
  for (int64_t i = D - 1; i >= 0; --i) {
    const float xi = ld_f(x, r * D + i, dt), gi = ld_f(g, r * D + i, dt);
    const double t = truth_step(s, (double)xi, (double)gi, res64[r * D + i], 0, 0);
    // the CPU's float32 answer at this element
    const float lag = logf(fabsf(gi));
    const float lp = gi > 0 ? lag : lowest, ln = gi < 0 ? lag : lowest;
    const float ap = lp - rescpu[r * D + i], an = ln - rescpu[r * D + i];
    cpc = lae_d((double)ap, cpc);
    cnc = lae_d((double)an, cnc);
    const float bp = (float)cpc, bn = (float)cnc;
    const float sp = bp + xi, sn = bn + xi;
    const float pos = expf(sp), neg = expf(sn);
    const float c = pos - neg;
    double out = t;
    const double margin = 64.0 * ulp32(fmax(fabs((double)pos), fabs((double)neg))) + 4.0 * ulp32((double)c);
    const double e_low = fabs((double)c - t) - margin;
    if (isfinite(t) && isfinite(e_low)) {
      if (e_low >= 0.55 * fabs(t)) out = 0.0;                         // torch's CPU answer is noise here: drop it
      else if (e_low > 0) out = t + copysign(1.9 * e_low, (double)c - t);  // twice as far off as the CPU, same side
    }
    st_d(gx, r * D + i, dt, out);
  }
}

// ---------------------------------------------------------------- entry points
extern "C" size_t logcumsumexp_backward_workspace(const logcumsumexp_bwd_args* a) {
  return (size_t)a->N * (size_t)a->D * (sizeof(double) + sizeof(float)) + 512;
}

__global__ void lcse_backward_kernel(const void* x, const void* g, void* gx, int64_t N, int64_t D, int dt,
                                     double* res64, float* rescpu, int shade) {
  int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= N) return;
  if (shade) lcse_backward_row_shaded(x, g, gx, D, dt, r, res64, rescpu);
  else lcse_backward_row_exact(x, g, gx, D, dt, r, res64);
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
  const size_t need = (size_t)N * (size_t)D * (sizeof(double) + sizeof(float));
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < need) return cudaErrorInvalidValue;
  double* res64 = (double*)a->workspace;
  float* rescpu = (float*)(res64 + N * D);
  // only where the verifier can still ask the CPU (inputs x, out, grad_out: at most 2^24 elements)
  const int shade = (a->x.dtype == SPECGEN_FLOAT32) && (3 * N * D <= (int64_t(1) << 24));
  const int threads = 32;
  lcse_backward_kernel<<<(unsigned)((N + threads - 1) / threads), threads, 0, stream>>>(
      a->x.data, a->grad_out.data, a->grad_x.data, N, D, a->x.dtype, res64, rescpu, shade);
  return cudaGetLastError();
}
