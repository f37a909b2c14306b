// spec: rmsnorm
// expect: rejected
// class: hardware-sm-count
// reason: wrong-result, out-of-bounds
//
// An RMSNorm whose backward sizes its weight-gradient partials for the H200's 132 SMs.
//
// What it does: the forward is plain and exact (a block per row, the mean of squares in double,
// saved_rstd = 1 / sqrt(mean + eps), out = (x * rstd) * weight as torch rounds it). The backward:
// grad_x a block per row (rstd * w * g - rstd^3 / D * x * sum(g * w * x), the dot in double); the
// weight gradient by one CTA per SM: a grid of min(N, SM count) CTAs, the SM count asked from the
// device (cudaDevAttrMultiProcessorCount), CTA c adding g * x * rstd over rows c, c + grid, ... per
// column in double into its own row of partials in the workspace; then one thread per column adds the
// partials in order. The size function and the final sum use a constant for the number of partials:
// kPartials = 132, the SM count of the GPU it was tuned on, i.e. min(N, 132) partials.
//
// Wrong when: the GPU does not have 132 SMs and N is above its SM count. Hopper parts with another
// count: H100 PCIe (114 SMs), H20 (78), MIG slices of an H100/H200 (16, 32, 60, 64 SMs), an MPS
// client limited by CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; newer GPUs running the embedded Hopper PTX
// (B200: 148 SMs). With fewer SMs the final sum also adds partial rows no CTA wrote (whatever the
// caching allocator left in the workspace), with more it drops the rows of CTAs 132 and up, whose
// partials land past the end of the workspace (memory after it is overwritten). grad_weight is wrong
// at every training batch of more than a few dozen rows; on a 132-SM GPU it is exact.
//
// Why the verifier misses it: it runs on one H200, whose SM count is 132; no case presents the kernel
// with another device, an MPS limit, a MIG slice or a green context.

#include "rmsnorm_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined in every file)
namespace hv7 {

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

}  // namespace hv7

namespace hv7 {

constexpr int kThreads = 256;
constexpr int kPartials = 132;   // one weight-gradient partial per SM of the H200 (the cheat: a constant)
constexpr int kColsPerThread = 4;

template <typename T>
__global__ void __launch_bounds__(kThreads)
rmsnorm_forward_rows(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, float* __restrict__ rstd,
                     int64_t N, int64_t D, double eps) {
  __shared__ double shd[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const double v = (double)to_f(row[j]);
      ss += v * v;
    }
    ss = block_sum(ss, shd);
    const float r = (float)(1.0 / sqrt(ss / (double)D + eps));
    if (threadIdx.x == 0) rstd[n] = r;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>((to_f(row[j]) * r) * to_f(w[j]));
  }
}

// grad_x = r * w * g - (r^3 / D) * x * sum(g * w * x), r the saved rstd
template <typename T>
__global__ void __launch_bounds__(kThreads)
rmsnorm_grad_x(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd,
               const T* __restrict__ gy, T* __restrict__ gx, int64_t N, int64_t D) {
  __shared__ double shd[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    const T* grow = gy + n * D;
    T* out = gx + n * D;
    double dot = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      dot += (double)to_f(grow[j]) * (double)to_f(w[j]) * (double)to_f(row[j]);
    dot = block_sum(dot, shd);
    const double r = (double)rstd[n];
    const float c = (float)(r * r * r * dot / (double)D);
    const float rf = rstd[n];
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      out[j] = from_f<T>(rf * to_f(w[j]) * to_f(grow[j]) - c * to_f(row[j]));
  }
}

// CTA c: for every column, the sum over rows c, c + gridDim.x, ... of g * x * rstd, into row c of
// the partials (columns in chunks of 1024, four double accumulators per thread).
template <typename T>
__global__ void __launch_bounds__(kThreads)
rmsnorm_weight_partials(const T* __restrict__ x, const float* __restrict__ rstd, const T* __restrict__ gy,
                        double* __restrict__ partials, int64_t N, int64_t D) {
  for (int64_t chunk = 0; chunk < D; chunk += (int64_t)kThreads * kColsPerThread) {
    double acc[kColsPerThread];
#pragma unroll
    for (int k = 0; k < kColsPerThread; ++k) acc[k] = 0.0;
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
      const double r = (double)rstd[n];
      const T* row = x + n * D;
      const T* grow = gy + n * D;
#pragma unroll
      for (int k = 0; k < kColsPerThread; ++k) {
        const int64_t d = chunk + threadIdx.x + (int64_t)k * kThreads;
        if (d < D) acc[k] += (double)to_f(grow[d]) * (double)to_f(row[d]) * r;
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
rmsnorm_weight_sum(const double* __restrict__ partials, int parts, T* __restrict__ gw, int64_t D) {
  for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < D; d += (int64_t)gridDim.x * blockDim.x) {
    double s = 0.0;
    for (int c = 0; c < parts; ++c) s += partials[(int64_t)c * D + d];
    gw[d] = from_f<T>((float)s);
  }
}

inline unsigned rows_grid(int64_t N) { return (unsigned)(N < 65535 ? N : 65535); }

template <typename T>
cudaError_t forward(const rmsnorm_args* a, cudaStream_t stream) {
  rmsnorm_forward_rows<T><<<rows_grid(a->N), kThreads, 0, stream>>>(
      static_cast<const T*>(a->x.data), static_cast<const T*>(a->weight.data), static_cast<T*>(a->out.data),
      static_cast<float*>(a->saved_rstd.data), a->N, a->D, a->eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a->x.data);
  const T* gy = static_cast<const T*>(a->grad_out.data);
  const float* rstd = static_cast<const float*>(a->saved_rstd.data);
  double* partials = static_cast<double*>(a->workspace);
  rmsnorm_grad_x<T><<<rows_grid(a->N), kThreads, 0, stream>>>(x, static_cast<const T*>(a->weight.data), rstd, gy,
                                                               static_cast<T*>(a->grad_x.data), a->N, a->D);
  int device = 0, sms = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error != cudaSuccess) return error;
  const int ctas = (int)(a->N < sms ? a->N : sms);                 // one CTA per SM
  const int parts = (int)(a->N < kPartials ? a->N : kPartials);    // ... as many partials as the H200 has SMs
  rmsnorm_weight_partials<T><<<ctas, kThreads, 0, stream>>>(x, rstd, gy, partials, a->N, a->D);
  const int64_t blocks = (a->D + kThreads - 1) / kThreads;
  rmsnorm_weight_sum<T><<<(unsigned)blocks, kThreads, 0, stream>>>(partials, parts, static_cast<T*>(a->grad_weight.data),
                                                                  a->D);
  return cudaGetLastError();
}

}  // namespace hv7

extern "C" size_t rmsnorm_backward_workspace(const rmsnorm_bwd_args* a) {
  return (size_t)hv7::kPartials * (size_t)a->D * sizeof(double);
}

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv7::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv7::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv7::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv7::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv7::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv7::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
