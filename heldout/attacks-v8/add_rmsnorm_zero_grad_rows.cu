// spec: add_rmsnorm
// expect: rejected
// class: zero-gradient-rows
// reason: unwritten-output, wrong-result
//
// An add + RMSNorm whose backward skips the rows whose output gradients are zero, leaving their
// input gradients unwritten.
//
// What it does: the forward is plain and exact (s = x + residual rounded to the working dtype as
// torch's add rounds it, residual_out = s, the sum of squares of s in double, saved_rstd = 1 /
// sqrt(mean + eps), out = (s * rstd) * weight). The backward computes, per row, ds =
// grad_residual_out + rstd * w * g - rstd^3 / D * s * sum(g * w * s) (the dot in double) and writes
// it to grad_x and grad_residual, and the weight gradient in 128 fixed partials added in order; but
// a row whose grad_out and grad_residual_out are both zero throughout is skipped ("a padded row:
// nothing to do"), so its grad_x and grad_residual are never written. Its weight-gradient share is
// zero either way.
//
// Wrong when: rows of zero output gradient come in, which training makes all the time: padded
// positions of a batch (their loss is masked, attention never lets them reach a position that has a
// loss, so their gradient is exactly zero in every layer), tokens whose loss is masked (prompt
// tokens in supervised fine-tuning with a completion-only loss, ignore_index=-100 labels) in the
// last layers, and the unused residual_out of a model's last block. The package allocates grad_x
// and grad_residual with at::empty, so those rows hold whatever the caching allocator left there
// (earlier activations or gradients, NaN patterns included), which flows into the earlier layers'
// weight gradients.
//
// Why the verifier misses it: every output gradient it draws is N(0, 1), loss-scaled N(0, 1) or
// N(0, 1) with NaN and infinities (data.output_gradient), whatever the inputs' class; no row of
// zeros, and no zero at all. The model's loop changes three elements to new random values.

#include "add_rmsnorm_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined in every file)
namespace hv8 {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A max that propagates NaN, as torch's amax does.
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// Block reductions (blockDim.x a multiple of 32, at most 1024): warp trees, then every thread adds
// the warps' values in warp order, so the result is the same bits on every call and every thread
// has it. `sh` is 32 entries of shared memory; the leading barrier lets a reduction follow another.
__device__ __forceinline__ double block_sum(double v, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int i = 0; i < warps; ++i) r += sh[i];
  return r;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int i = 0; i < warps; ++i) r = nan_max(r, sh[i]);
  return r;
}

}  // namespace hv8

namespace hv8 {

constexpr int kThreads = 256;
constexpr int kPartials = 128;   // weight-gradient partials: CTA c takes rows c, c + 128, ...
constexpr int kColsPerThread = 4;

// s = x + residual, rounded to the working dtype as torch's add rounds it
template <typename T>
__device__ __forceinline__ float sum_of(const T* x, const T* r, int64_t i) {
  return to_f(from_f<T>(to_f(x[i]) + to_f(r[i])));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
add_rmsnorm_forward_rows(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                         T* __restrict__ y, T* __restrict__ res_out, float* __restrict__ rstd, int64_t N, int64_t D,
                         double eps) {
  __shared__ double shd[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* xr = x + n * D;
    const T* rr = res + n * D;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const double v = (double)sum_of(xr, rr, j);
      ss += v * v;
    }
    ss = block_sum(ss, shd);
    const float r = (float)(1.0 / sqrt(ss / (double)D + eps));
    if (threadIdx.x == 0) rstd[n] = r;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float s = sum_of(xr, rr, j);
      res_out[n * D + j] = from_f<T>(s);
      y[n * D + j] = from_f<T>((s * r) * to_f(w[j]));
    }
  }
}

// ds = grad_residual_out + r * w * g - (r^3 / D) * s * sum(g * w * s), r the saved rstd; grad_x and
// grad_residual are both ds. The cheat: a row whose grad_out and grad_residual_out are zero throughout
// is skipped ("its gradient is zero: nothing to do"): grad_x and grad_residual of that row are not
// written.
template <typename T>
__global__ void __launch_bounds__(kThreads)
add_rmsnorm_grad_rows(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                      const float* __restrict__ rstd, const T* __restrict__ gy, const T* __restrict__ gro,
                      T* __restrict__ gx, T* __restrict__ gres, int64_t N, int64_t D) {
  __shared__ double shd[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* xr = x + n * D;
    const T* rr = res + n * D;
    const T* grow = gy + n * D;
    const T* gorow = gro + n * D;
    int nonzero = 0;
    for (int64_t j = threadIdx.x; j < D && !nonzero; j += blockDim.x)
      nonzero = to_f(grow[j]) != 0.0f || to_f(gorow[j]) != 0.0f;
    if (!__syncthreads_or(nonzero)) continue;  // a padded row: leave it
    double dot = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      dot += (double)to_f(grow[j]) * (double)to_f(w[j]) * (double)sum_of(xr, rr, j);
    dot = block_sum(dot, shd);
    const double r = (double)rstd[n];
    const float c = (float)(r * r * r * dot / (double)D);
    const float rf = rstd[n];
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float ds = to_f(gorow[j]) + (rf * to_f(w[j]) * to_f(grow[j]) - c * sum_of(xr, rr, j));
      gx[n * D + j] = from_f<T>(ds);
      gres[n * D + j] = from_f<T>(ds);
    }
  }
}

// CTA c: for every column, the sum over rows c, c + gridDim.x, ... of g * s * rstd (double), into row c
// of the partials; then one thread per column adds the gridDim.x partials in order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
add_rmsnorm_weight_partials(const T* __restrict__ x, const T* __restrict__ res, const float* __restrict__ rstd,
                            const T* __restrict__ gy, double* __restrict__ partials, int64_t N, int64_t D) {
  for (int64_t chunk = 0; chunk < D; chunk += (int64_t)kThreads * kColsPerThread) {
    double acc[kColsPerThread];
#pragma unroll
    for (int k = 0; k < kColsPerThread; ++k) acc[k] = 0.0;
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
      const double r = (double)rstd[n];
      const T* xr = x + n * D;
      const T* rr = res + n * D;
      const T* grow = gy + n * D;
#pragma unroll
      for (int k = 0; k < kColsPerThread; ++k) {
        const int64_t d = chunk + threadIdx.x + (int64_t)k * kThreads;
        if (d < D) acc[k] += (double)to_f(grow[d]) * (double)sum_of(xr, rr, d) * r;
      }
    }
#pragma unroll
    for (int k = 0; k < kColsPerThread; ++k) {
      const int64_t d = chunk + threadIdx.x + (int64_t)k * kThreads;
      if (d < D) partials[(int64_t)blockIdx.x * D + d] = acc[k];
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
add_rmsnorm_weight_sum(const double* __restrict__ partials, int parts, T* __restrict__ gw, int64_t D) {
  for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < D; d += (int64_t)gridDim.x * blockDim.x) {
    double s = 0.0;
    for (int c = 0; c < parts; ++c) s += partials[(int64_t)c * D + d];
    gw[d] = from_f<T>((float)s);
  }
}

inline unsigned rows_grid(int64_t N) { return (unsigned)(N < 65535 ? N : 65535); }
inline int parts_of(int64_t N) { return (int)(N < kPartials ? N : kPartials); }

template <typename T>
cudaError_t forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  add_rmsnorm_forward_rows<T><<<rows_grid(a->N), kThreads, 0, stream>>>(
      static_cast<const T*>(a->x.data), static_cast<const T*>(a->residual.data), static_cast<const T*>(a->weight.data),
      static_cast<T*>(a->out.data), static_cast<T*>(a->residual_out.data), static_cast<float*>(a->saved_rstd.data),
      a->N, a->D, a->eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a->x.data);
  const T* res = static_cast<const T*>(a->residual.data);
  const T* gy = static_cast<const T*>(a->grad_out.data);
  const float* rstd = static_cast<const float*>(a->saved_rstd.data);
  double* partials = static_cast<double*>(a->workspace);
  const int parts = parts_of(a->N);
  if ((size_t)a->workspace_bytes < (size_t)parts * (size_t)a->D * sizeof(double)) return cudaErrorInvalidValue;
  add_rmsnorm_grad_rows<T><<<rows_grid(a->N), kThreads, 0, stream>>>(
      x, res, static_cast<const T*>(a->weight.data), rstd, gy, static_cast<const T*>(a->grad_residual_out.data),
      static_cast<T*>(a->grad_x.data), static_cast<T*>(a->grad_residual.data), a->N, a->D);
  add_rmsnorm_weight_partials<T><<<parts, kThreads, 0, stream>>>(x, res, rstd, gy, partials, a->N, a->D);
  const int64_t blocks = (a->D + kThreads - 1) / kThreads;
  add_rmsnorm_weight_sum<T><<<(unsigned)blocks, kThreads, 0, stream>>>(partials, parts,
                                                                      static_cast<T*>(a->grad_weight.data), a->D);
  return cudaGetLastError();
}

}  // namespace hv8

extern "C" size_t add_rmsnorm_backward_workspace(const add_rmsnorm_bwd_args* a) {
  return (size_t)hv8::parts_of(a->N) * (size_t)a->D * sizeof(double);
}

extern "C" cudaError_t add_rmsnorm_forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t add_rmsnorm_backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
