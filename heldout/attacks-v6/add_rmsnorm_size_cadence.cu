// spec: add_rmsnorm
// expect: rejected
// class: verifier-detection (the size function's call pattern)
// reason: wrong-result, post-timing-mismatch
//
// When it is wrong: when it is called the way the package calls it. The package's binding calls
// add_rmsnorm_forward_workspace(&args) and then add_rmsnorm_forward(&args, stream) with the same
// struct, for every call. The verifier asks the size function once per staged case (in one
// request, for every call the case will make) and then makes the calls: a call right after a
// question about its own arguments happens there at most twice in a row (a capture's call, then
// the first call of the next case). The kernel keeps the last struct it was asked about (every
// byte before the workspace fields) and counts calls in a row that each follow a question
// about their own arguments; from the 4th such call on, it estimates each row's mean of squares
// from the first 256 elements of the row only. Outputs stay written, finite and plausible.
// Everything the verifier runs (every case, the capture, the loops, side by side, endurance, the
// timed calls, the benchmark through the same timed-call code) computes the full row, exactly.
// Why it matters: a kernel that is exact under verification and wrong from the 4th call of every
// real model (any D > 256: every hidden size), using only the ABI's own size function and no
// forbidden symbol. The verifier's calls differ from the package's in a way a kernel can count.
// Backward is honest.

#include "add_rmsnorm_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined)
namespace hv6 {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// the value a torch op in dtype T gives for a float result: rounded to T (and read back)
template <typename T> __device__ __forceinline__ float rnd(float v) { return to_f(from_f<T>(v)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_or(int v) { return __any_sync(0xffffffffu, v) ? 1 : 0; }

// Sum over the block (blockDim.x a multiple of 32, at most 1024), the same tree every call;
// every thread gets the result. `red` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = (threadIdx.x < warps) ? red[threadIdx.x] : 0.f;
  if (warp == 0) t = warp_sum(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}
__device__ __forceinline__ double block_sum_d(double v, double* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double t = (threadIdx.x < warps) ? red[threadIdx.x] : 0.0;
  if (warp == 0) t = warp_sum_d(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = (threadIdx.x < warps) ? red[threadIdx.x] : -INFINITY;
  if (warp == 0) t = warp_max(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}

// Online (max, sum of exp) of a row, torch's semantics kept: NaN anywhere makes the sum NaN,
// +inf makes it NaN (exp(inf - inf)), -inf contributes 0, a row with no finite element keeps
// max = -inf (its outputs come out NaN, as torch's do).
struct MS { float m, s; };
__device__ __forceinline__ void ms_add(MS& a, float x) {
  if (x == -INFINITY) return;
  if (isnan(x)) { a.s = x; return; }
  const float m = fmaxf(a.m, x);
  a.s = a.s * expf(a.m - m) + expf(x - m);
  a.m = m;
}
// merging two partials; both empty (max -inf): still empty, NaN kept
__device__ __forceinline__ MS ms_merge(MS a, MS b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return MS{m, a.s + b.s};
  return MS{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ __forceinline__ MS warp_ms(MS a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MS b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
    a = ms_merge(a, b);
  }
  return a;
}
// over the block (same tree every call); `red` holds 64 floats of shared memory
__device__ __forceinline__ MS block_ms(MS a, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = warp_ms(a);
  __syncthreads();
  if (lane == 0) { red[warp] = a.m; red[32 + warp] = a.s; }
  __syncthreads();
  MS t{-INFINITY, 0.f};
  if (threadIdx.x < warps) t = MS{red[threadIdx.x], red[32 + threadIdx.x]};
  if (warp == 0) t = warp_ms(t);
  if (threadIdx.x == 0) { red[0] = t.m; red[32] = t.s; }
  __syncthreads();
  return MS{red[0], red[32]};
}

}  // namespace hv6

// ---------------------------------------------------------------- add_rmsnorm: shared pieces
namespace ar {
using namespace hv6;

// s = x + residual in the working dtype (torch adds in float and rounds to T)
template <typename T> __device__ __forceinline__ float sum_at(const T* x, const T* res, int64_t i) {
  return rnd<T>(to_f(x[i]) + to_f(res[i]));
}

// the honest forward of one row (one block per row): residual_out = s, out = (s * r) * w,
// saved_rstd = r = rsqrt(mean(s^2) + eps)
template <typename T>
__global__ void __launch_bounds__(256) fwd_rows(const T* __restrict__ x, const T* __restrict__ res,
                                                const T* __restrict__ w, float eps, int64_t D, T* __restrict__ out,
                                                T* __restrict__ res_out, float* __restrict__ rstd) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  const T* rr = res + row * D;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float s = sum_at(xr, rr, j); acc += s * s; }
  const float r = rsqrtf(block_sum(acc, red) / (float)D + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  T* yr = out + row * D;
  T* sr = res_out + row * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float s = sum_at(xr, rr, j);
    sr[j] = from_f<T>(s);
    yr[j] = from_f<T>((s * r) * to_f(w[j]));
  }
}

// backward, per row: ds = grad_residual_out + r * (g*w - (s*r) * (sum(g*w*s) * r / D));
// grad_x = grad_residual = ds
template <typename T>
__global__ void __launch_bounds__(256) bwd_rows(const T* __restrict__ x, const T* __restrict__ res,
                                                const T* __restrict__ w, const float* __restrict__ rstd,
                                                const T* __restrict__ g, const T* __restrict__ g_res, int64_t D,
                                                T* __restrict__ gx, T* __restrict__ gres) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const int64_t base = row * D;
  const float r = rstd[row];
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    acc += to_f(g[base + j]) * to_f(w[j]) * sum_at(x + base, res + base, j);
  const float c = block_sum(acc, red) * r / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float s = sum_at(x + base, res + base, j);
    const float d_norm = r * (to_f(g[base + j]) * to_f(w[j]) - (s * r) * c);
    const T ds = from_f<T>(to_f(g_res[base + j]) + rnd<T>(d_norm));
    gx[base + j] = ds;
    gres[base + j] = ds;
  }
}

// grad_weight = sum over rows of g * (s * r): row-chunk partials in double, then summed in order
constexpr int CHUNKS = 64;
inline int chunks_for(int64_t N) { return (int)(N < CHUNKS ? N : CHUNKS); }
template <typename T>
__global__ void __launch_bounds__(256) gw_partials(const T* __restrict__ x, const T* __restrict__ res,
                                                   const float* __restrict__ rstd, const T* __restrict__ g, int64_t N,
                                                   int64_t D, double* __restrict__ part) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= D) return;
  const int64_t per = (N + gridDim.y - 1) / gridDim.y;
  const int64_t lo = (int64_t)blockIdx.y * per, hi = lo + per < N ? lo + per : N;
  double acc = 0.0;
  for (int64_t row = lo; row < hi; ++row)
    acc += (double)(to_f(g[row * D + col]) * (sum_at(x + row * D, res + row * D, col) * rstd[row]));
  part[(int64_t)blockIdx.y * D + col] = acc;
}
template <typename T>
__global__ void __launch_bounds__(256) gw_sum(const double* __restrict__ part, int chunks, int64_t D, T* __restrict__ gw) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= D) return;
  double acc = 0.0;
  for (int k = 0; k < chunks; ++k) acc += part[(int64_t)k * D + col];
  gw[col] = from_f<T>((float)acc);
}

template <typename T>
cudaError_t backward_t(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  const int chunks = chunks_for(N);
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < (size_t)chunks * D * sizeof(double)) return cudaErrorInvalidValue;
  double* part = (double*)a->workspace;
  const T* x = (const T*)a->x.data;
  const T* res = (const T*)a->residual.data;
  const float* rstd = (const float*)a->saved_rstd.data;
  const T* g = (const T*)a->grad_out.data;
  bwd_rows<T><<<(unsigned)N, 256, 0, stream>>>(x, res, (const T*)a->weight.data, rstd, g,
                                               (const T*)a->grad_residual_out.data, D, (T*)a->grad_x.data,
                                               (T*)a->grad_residual.data);
  const dim3 grid((unsigned)((D + 255) / 256), (unsigned)chunks);
  gw_partials<T><<<grid, 256, 0, stream>>>(x, res, rstd, g, N, D, part);
  gw_sum<T><<<(unsigned)((D + 255) / 256), 256, 0, stream>>>(part, chunks, D, (T*)a->grad_weight.data);
  return cudaGetLastError();
}

template <typename T>
cudaError_t forward_plain(const add_rmsnorm_args* a, cudaStream_t stream) {
  fwd_rows<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->residual.data,
                                                  (const T*)a->weight.data, (float)a->eps, a->D, (T*)a->out.data,
                                                  (T*)a->residual_out.data, (float*)a->saved_rstd.data);
  return cudaGetLastError();
}
}  // namespace ar

extern "C" size_t add_rmsnorm_backward_workspace(const add_rmsnorm_bwd_args* a) {
  return (size_t)ar::chunks_for(a->N) * (size_t)a->D * sizeof(double);
}

extern "C" cudaError_t add_rmsnorm_backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return ar::backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return ar::backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return ar::backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

// ---------------------------------------------------------------- the kernel
namespace {
using namespace hv6;

// Two launches: the row statistics into the workspace (one float per row), then the outputs.
template <typename T>
__global__ void __launch_bounds__(256) stats_rows(const T* __restrict__ x, const T* __restrict__ res, float eps,
                                                  int64_t D, int64_t sampled, float* __restrict__ r_out) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  const T* rr = res + row * D;
  // `sampled` < D: the mean of squares estimated from the first `sampled` elements of the row
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < sampled; j += blockDim.x) { const float s = ar::sum_at(xr, rr, j); acc += s * s; }
  const float r = rsqrtf(block_sum(acc, red) / (float)sampled + eps);
  if (threadIdx.x == 0) r_out[row] = r;
}
template <typename T>
__global__ void __launch_bounds__(256) write_rows(const T* __restrict__ x, const T* __restrict__ res,
                                                  const T* __restrict__ w, const float* __restrict__ r_in, int64_t D,
                                                  T* __restrict__ out, T* __restrict__ res_out, float* __restrict__ rstd) {
  const int64_t row = blockIdx.x;
  const float r = r_in[row];
  if (threadIdx.x == 0) rstd[row] = r;
  const T* xr = x + row * D;
  const T* rr = res + row * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float s = ar::sum_at(xr, rr, j);
    res_out[row * D + j] = from_f<T>(s);
    out[row * D + j] = from_f<T>((s * r) * to_f(w[j]));
  }
}

// ---- how the call is being made
// The package's binding asks the size function for every call, with the very argument struct
// it then passes to the entry point, just before the call. The verifier asks once per staged
// case, for all the calls of the case at once, and then makes them: a call right after a
// question about its own arguments happens there at most twice in a row.
constexpr size_t COMPARED = offsetof(add_rmsnorm_args, workspace);  // everything but the workspace fields
unsigned char g_asked[COMPARED];
bool g_asked_valid;
int g_streak;  // calls in a row, each right after a question about its own arguments
constexpr int PACKAGE = 4;

template <typename T>
cudaError_t forward_t(const add_rmsnorm_args* a, cudaStream_t stream, bool package) {
  const int64_t N = a->N, D = a->D;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < (size_t)N * sizeof(float)) return cudaErrorInvalidValue;
  float* r = (float*)a->workspace;
  const int64_t sampled = package && D > 256 ? 256 : D;  // "the first 256 elements are a good enough estimate"
  stats_rows<T><<<(unsigned)N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->residual.data, (float)a->eps, D,
                                                 sampled, r);
  write_rows<T><<<(unsigned)N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->residual.data,
                                                 (const T*)a->weight.data, r, D, (T*)a->out.data,
                                                 (T*)a->residual_out.data, (float*)a->saved_rstd.data);
  return cudaGetLastError();
}
}  // namespace

extern "C" size_t add_rmsnorm_forward_workspace(const add_rmsnorm_args* a) {
  memcpy(g_asked, a, COMPARED);
  g_asked_valid = true;
  return (size_t)a->N * sizeof(float);
}

extern "C" cudaError_t add_rmsnorm_forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  const bool paired = g_asked_valid && memcmp(g_asked, a, COMPARED) == 0;
  g_asked_valid = false;
  g_streak = paired ? g_streak + 1 : 0;
  const bool package = g_streak >= PACKAGE;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream, package);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream, package);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream, package);
    default: return cudaErrorInvalidValue;
  }
}
