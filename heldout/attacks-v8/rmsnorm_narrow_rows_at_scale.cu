// spec: rmsnorm
// expect: rejected
// class: narrow-rows-at-scale
// reason: wrong-result
//
// An RMSNorm whose schedule for many narrow rows normalizes each row by the RMS of it and its
// neighbour.
//
// What it does: the forward is plain and exact (a block per row, the sum of squares in double,
// saved_rstd = 1 / sqrt(mean + eps), out = (x * rstd) * weight as torch rounds it), except for
// calls of 2^22 elements or more whose rows are at most 2048 wide: those take a "two rows per warp"
// schedule (16 lanes per row) whose sum of squares is a shuffle butterfly over offsets 16, 8, 4, 2,
// 1, so lanes 0-15 and 16-31 add each other's row in (the half-warp butterfly starts at 8). Both
// rows of a pair get the RMS of the pair; saved_rstd likewise. The backward is plain and exact for
// every shape (grad_x a block per row, the weight gradient in 128 fixed partials added in order).
//
// Wrong when: rows of at most 2048 elements come in calls of 2^22 elements or more (2048 rows of
// 2048, 32768 rows of 128): QK-norm (an RMSNorm over each head's 64-256 features, in Qwen3, OLMo 2,
// Gemma 3 and others: tokens x heads rows, e.g. 2048 tokens x 32 heads = 65536 rows of 128), and
// small models' hidden sizes (Llama 3.2 1B's and TinyLlama's 2048, Qwen2.5's 1536 and 896,
// SmolLM2's 576 and 960) at training or prefill batch sizes (8 x 1024 tokens). Every row there is
// normalized by a wrong RMS (the pair's: off by up to sqrt(2) and more when the rows' scales
// differ).
//
// Why the verifier misses it: no case has both: small cases stay within 2^20 elements (4 x that for
// the large case), and every full-size case keeps a row of 3072 or more (the benchmark shapes' 4096
// and 8192, the tops of the ranges, their odd and model-size twins, model widths 3072, 5120, 7168,
// and the value classes at the first benchmark shape); the timed shapes are 8192 and 4096 wide. The
// sweep walks one dim at a time with the others small.

#include "rmsnorm_abi.h"
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
constexpr int kPartials = 128;             // weight-gradient partials: CTA c takes rows c, c + 128, ...
constexpr int kColsPerThread = 4;
constexpr int64_t kNarrowWidth = 2048;     // rows this wide or narrower ...
constexpr int64_t kNarrowElements = int64_t(1) << 22;  // ... in calls this large: two rows per warp

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

// Many narrow rows: two rows per warp, lanes 0-15 on the first, 16-31 on the second. The cheat: the
// half-warp sum of squares is a butterfly that starts at offset 16, which adds the other half-warp's
// row in (the right butterfly starts at 8). Both rows are normalized by the RMS of the pair.
template <typename T>
__global__ void __launch_bounds__(kThreads)
rmsnorm_forward_pairs(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, float* __restrict__ rstd,
                      int64_t N, int64_t D, double eps) {
  const int lane = threadIdx.x & 31, sub = lane & 15;
  const int64_t first_warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t pair = first_warp; pair * 2 < N; pair += warps) {
    const int64_t n = pair * 2 + (lane >> 4);
    const bool live = n < N;
    const T* row = x + n * D;
    double ss = 0.0;
    if (live) {
      for (int64_t j = sub; j < D; j += 16) {
        const double v = (double)to_f(row[j]);
        ss += v * v;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = (float)(1.0 / sqrt(ss / (double)D + eps));
    if (live) {
      if (sub == 0) rstd[n] = r;
      T* out = y + n * D;
      for (int64_t j = sub; j < D; j += 16) out[j] = from_f<T>((to_f(row[j]) * r) * to_f(w[j]));
    }
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

// CTA c: for every column, the sum over rows c, c + gridDim.x, ... of g * x * rstd (double), into row c
// of the partials; then one thread per column adds the gridDim.x partials in order.
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
inline int parts_of(int64_t N) { return (int)(N < kPartials ? N : kPartials); }

template <typename T>
cudaError_t forward(const rmsnorm_args* a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a->x.data);
  const T* w = static_cast<const T*>(a->weight.data);
  T* y = static_cast<T*>(a->out.data);
  float* rstd = static_cast<float*>(a->saved_rstd.data);
  if (a->D <= kNarrowWidth && a->N * a->D >= kNarrowElements) {  // many narrow rows: two per warp
    const int64_t pairs = (a->N + 1) / 2;
    const int64_t blocks = (pairs + (kThreads / 32) - 1) / (kThreads / 32);
    rmsnorm_forward_pairs<T><<<(unsigned)(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(
        x, w, y, rstd, a->N, a->D, a->eps);
  } else {
    rmsnorm_forward_rows<T><<<rows_grid(a->N), kThreads, 0, stream>>>(x, w, y, rstd, a->N, a->D, a->eps);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a->x.data);
  const T* gy = static_cast<const T*>(a->grad_out.data);
  const float* rstd = static_cast<const float*>(a->saved_rstd.data);
  double* partials = static_cast<double*>(a->workspace);
  const int parts = parts_of(a->N);
  if ((size_t)a->workspace_bytes < (size_t)parts * (size_t)a->D * sizeof(double)) return cudaErrorInvalidValue;
  rmsnorm_grad_x<T><<<rows_grid(a->N), kThreads, 0, stream>>>(x, static_cast<const T*>(a->weight.data), rstd, gy,
                                                               static_cast<T*>(a->grad_x.data), a->N, a->D);
  rmsnorm_weight_partials<T><<<parts, kThreads, 0, stream>>>(x, rstd, gy, partials, a->N, a->D);
  const int64_t blocks = (a->D + kThreads - 1) / kThreads;
  rmsnorm_weight_sum<T><<<(unsigned)blocks, kThreads, 0, stream>>>(partials, parts, static_cast<T*>(a->grad_weight.data),
                                                                  a->D);
  return cudaGetLastError();
}

}  // namespace hv8

extern "C" size_t rmsnorm_backward_workspace(const rmsnorm_bwd_args* a) {
  return (size_t)hv8::parts_of(a->N) * (size_t)a->D * sizeof(double);
}

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
