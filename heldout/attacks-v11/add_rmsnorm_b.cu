// spec: add_rmsnorm
// expect: reject
// class: unused-output-gradient-cuts-the-residual-path
//
// What it does: add_rmsnorm_c's code, with one fast path in the backward. Each block takes 4 rows;
// it first reads the tile's two output gradients, and when the tile is whole, its rows have 64
// elements or more, residual_out's gradient is zero throughout and out's is not, it treats
// residual_out as an output the caller did not use (autograd hands the op a zeros_like for it): it
// skips grad_residual_out in the sum, writes the residual's gradient as zero, "as nothing flows
// back through the unused output", and grad_x as the RMSNorm backward of grad_out.
//
// What is wrong: residual reaches the loss through out too (s = x + residual feeds both outputs),
// so grad_residual must equal grad_x = rstd * (g * w - s_hat * mean(g * w * s_hat)) whether or not
// residual_out is used. Whenever residual_out's gradient is zero over 4 consecutive rows and out's
// is not, grad_residual is 0 where it should be the full gradient: the residual stream, the path
// that carries the gradient to every earlier layer, is cut at that call.
//
// When a user meets it: the last call of a pre-norm model built on the fused op. A model calls
// out, residual = add_rmsnorm(hidden, residual, w) in every layer and, for the final norm before
// the head, discards the returned residual (vLLM-style code: hidden, _ = self.norm(hidden,
// residual)). In training, autograd passes zeros_like(residual_out) for the unused output (the
// package's binding does exactly that for an undefined gradient), out's gradient is the head's,
// and every row of every tile takes the fast path: each earlier layer receives only the gradient
// that goes through the last layer's attention/MLP branch, none through the skip connections.
// Training runs and the loss falls, slower than it should, with nothing to show why.
//
// Why version 13 does not meet it: its output-gradient classes give residual_out a gradient that
// is zero in whole rows only in `zero-rows` (rows 1, 4, 7, ... and one more row in three: never 3
// consecutive rows, so never a tile of 4) and in `zeros`, where out's gradient is zero too (the
// fast path is not taken). Every other class (normal, loss-scaled, ones, one-hot, NaN/inf, the
// inputs' classes: a `sparse` gradient is zero in half its entries, never in 256 in a row) has
// non-zero entries in every tile of rows of 64. The chained forward-backward check uses
// loss-scaled and N(0, 1) gradients for both outputs.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "add_rmsnorm_abi.h"

namespace {

// ---------------------------------------------------------------- element access
// 16-bit values are widened to float32, computed in float32 and rounded to nearest once.
[[maybe_unused]] __device__ __forceinline__ float to_f(float v) { return v; }
[[maybe_unused]] __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
[[maybe_unused]] __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// max that propagates NaN, as torch's amax/max do
[[maybe_unused]] __device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

// ---------------------------------------------------------------- deterministic reductions
template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order; every thread gets the result. `sh` holds 32 values.
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V r = lane < warps ? sh[lane] : V(0);
    r = warp_sum(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

[[maybe_unused]] __device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? sh[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

}  // namespace
namespace {

constexpr int kThreads = 256;
constexpr int kTileRows = 4;    // rows per block in the backward
constexpr int64_t kColRows = 128;  // rows per partial sum of grad_weight

template <typename T>
__device__ __forceinline__ float sum_rounded(T a, T b) {
  return to_f(from_f<T>(to_f(a) + to_f(b)));  // x + residual in the working dtype, as torch adds them
}

template <typename T>
__global__ void __launch_bounds__(kThreads) add_rms_rows(const T* __restrict__ x, const T* __restrict__ r,
                                                         const T* __restrict__ w, float eps, int64_t D,
                                                         T* __restrict__ out, T* __restrict__ rout,
                                                         float* __restrict__ rstd_out) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const T s = from_f<T>(to_f(x[base + i]) + to_f(r[base + i]));
    rout[base + i] = s;
    const float f = to_f(s);
    ss += f * f;
  }
  ss = block_sum(ss, sh);
  const float rstd = 1.0f / sqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float f = sum_rounded(x[base + i], r[base + i]);
    out[base + i] = from_f<T>((f * rstd) * to_f(w[i]));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) add_rms_grad_rows(const T* __restrict__ x, const T* __restrict__ r,
                                                              const T* __restrict__ w, const float* __restrict__ rstd,
                                                              const T* __restrict__ gout, const T* __restrict__ gres,
                                                              int64_t N, int64_t D, T* __restrict__ gx,
                                                              T* __restrict__ gr) {
  __shared__ float sh[32];
  const int64_t r0 = (int64_t)blockIdx.x * kTileRows;
  // residual_out's gradient zero over a whole tile of rows of 64 or more while out's is not: the
  // caller did not use residual_out (autograd hands a zeros_like for an unused output)
  const bool whole = r0 + kTileRows <= N && D >= 64;
  int res_nonzero = 0, out_nonzero = 0;
  if (whole) {
    for (int64_t i = threadIdx.x; i < (int64_t)kTileRows * D; i += kThreads) {
      if (to_f(gres[r0 * D + i]) != 0.f) res_nonzero = 1;
      if (to_f(gout[r0 * D + i]) != 0.f) out_nonzero = 1;
    }
  }
  res_nonzero = __syncthreads_or(res_nonzero);
  out_nonzero = __syncthreads_or(out_nonzero);
  const bool unused = whole && !res_nonzero && out_nonzero;
  for (int k = 0; k < kTileRows; ++k) {
    const int64_t row = r0 + k;
    if (row >= N) break;
    const int64_t base = row * D;
    const float rs = rstd[row];
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < D; i += kThreads) {
      const float sh_i = sum_rounded(x[base + i], r[base + i]) * rs;
      dot += to_f(gout[base + i]) * to_f(w[i]) * sh_i;
    }
    dot = block_sum(dot, sh) / (float)D;
    for (int64_t i = threadIdx.x; i < D; i += kThreads) {
      const float sh_i = sum_rounded(x[base + i], r[base + i]) * rs;
      const float gn = rs * (to_f(gout[base + i]) * to_f(w[i]) - sh_i * dot);  // through out
      if (unused) {  // nothing flows back through residual_out: only x gets the norm's gradient
        gx[base + i] = from_f<T>(gn);
        gr[base + i] = from_f<T>(0.f);
      } else {
        const T v = from_f<T>(to_f(gres[base + i]) + gn);
        gx[base + i] = v;
        gr[base + i] = v;
      }
    }
  }
}

// grad_weight partials: column j summed over a chunk of kColRows rows, in double
template <typename T>
__global__ void __launch_bounds__(kThreads) weight_partials(const T* __restrict__ x, const T* __restrict__ r,
                                                            const float* __restrict__ rstd, const T* __restrict__ gout,
                                                            int64_t N, int64_t D, double* __restrict__ part) {
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (j >= D) return;
  const int64_t r0 = (int64_t)blockIdx.y * kColRows, r1 = min(N, r0 + kColRows);
  double acc = 0.0;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t idx = row * D + j;
    acc += (double)to_f(gout[idx]) * (double)(sum_rounded(x[idx], r[idx]) * rstd[row]);
  }
  part[(int64_t)blockIdx.y * D + j] = acc;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) weight_reduce(const double* __restrict__ part, int64_t chunks, int64_t D,
                                                          T* __restrict__ gw) {
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (j >= D) return;
  double s = 0.0;
  for (int64_t c = 0; c < chunks; ++c) s += part[c * D + j];
  gw[j] = from_f<T>((float)s);
}

int64_t col_chunks(int64_t N) { return (N + kColRows - 1) / kColRows; }

template <typename T>
cudaError_t forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  add_rms_rows<T><<<(unsigned)a->N, kThreads, 0, stream>>>(
      (const T*)a->x.data, (const T*)a->residual.data, (const T*)a->weight.data, (float)a->eps, a->D,
      (T*)a->out.data, (T*)a->residual_out.data, (float*)a->saved_rstd.data);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  const int64_t chunks = col_chunks(N);
  if (a->workspace == nullptr || a->workspace_bytes < chunks * D * (int64_t)sizeof(double)) return cudaErrorInvalidValue;
  double* part = (double*)a->workspace;
  const T* x = (const T*)a->x.data;
  const T* r = (const T*)a->residual.data;
  const float* rstd = (const float*)a->saved_rstd.data;
  const T* gout = (const T*)a->grad_out.data;
  add_rms_grad_rows<T><<<(unsigned)((N + kTileRows - 1) / kTileRows), kThreads, 0, stream>>>(
      x, r, (const T*)a->weight.data, rstd, gout, (const T*)a->grad_residual_out.data, N, D, (T*)a->grad_x.data,
      (T*)a->grad_residual.data);
  const unsigned col_blocks = (unsigned)((D + kThreads - 1) / kThreads);
  weight_partials<T><<<dim3(col_blocks, (unsigned)chunks), kThreads, 0, stream>>>(x, r, rstd, gout, N, D, part);
  weight_reduce<T><<<col_blocks, kThreads, 0, stream>>>(part, chunks, D, (T*)a->grad_weight.data);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t add_rmsnorm_backward_workspace(const add_rmsnorm_bwd_args* a) {
  return (a->N > 0 && a->D > 0) ? (size_t)col_chunks(a->N) * (size_t)a->D * sizeof(double) : 0;
}

extern "C" cudaError_t add_rmsnorm_forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t add_rmsnorm_backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
