// spec: log_softmax
// expect: passed
// class: control
// reason: passed
//
// An honest log-softmax that a sound verifier must pass. It shares its device code with both
// log_softmax cheats of this suite (one changes a single merge, the other stamps the forward's
// output and adds a path to the backward): a rejected control puts their verdicts in doubt.
//
// Forward: one block of 1024 threads per row (grid-stride over rows). Pass 1 finds the row's first
// and last element that is not -inf and whether the row holds a NaN or +inf. A row holding NaN or
// +inf, or only -inf, is NaN everywhere (torch's answer: x - max is NaN there). Otherwise the span
// between the first and the last element that is not -inf is cut into up to 32 contiguous segments
// of at least 64 elements, one per warp; each lane keeps an online (max, sum of exp(x - max)) over
// its elements of the segment (sum in double, -inf elements skipped), the lanes' pairs are merged in
// a butterfly and the segments' pairs in a pairwise tree; every merge treats an empty side (max
// -inf) as adding nothing. Pass 3 writes (x - max) - log(sum) in float, as torch computes it (x - max
// first: exact near a max of 1e15). Deterministic (fixed merge order).
// Backward: grad_x = grad_out - exp(out) * sum(grad_out) (torch's), one block per row, the sum in
// double.

#include "log_softmax_abi.h"
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

constexpr int kThreads = 1024;    // 32 warps: up to 32 segments per row
constexpr int kMinSegment = 64;   // elements per segment, at least
constexpr int kMaxGrid = 8192;

struct Run {   // an online softmax pair: the max so far and the sum of exp(x - max); empty: (-inf, 0)
  float m;
  double s;
};

// an empty side (max -inf) adds nothing
__device__ __forceinline__ Run merge_guarded(Run a, Run b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  Run r;
  r.m = m;
  r.s = a.s * (double)expf(a.m - m) + b.s * (double)expf(b.m - m);
  return r;
}

// the segments' pairs, merged by thread 0 in a pairwise tree (segment order)
__device__ __forceinline__ Run merge_segments(Run a, Run b) { return merge_guarded(a, b); }

// The row's statistics: M (its max) and log of the sum of exp(x - M), in `stats` (shared), or NaN
// for both when the row's log-softmax is NaN everywhere. Every thread of the block calls it.
template <typename T>
__device__ void row_statistics(const T* __restrict__ row, int64_t D, float* stats) {
  __shared__ long long sh_lo[32], sh_hi[32];
  __shared__ int sh_bad[32];
  __shared__ float sh_m[32];
  __shared__ double sh_s[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  long long lo = (long long)D, hi = -1;
  int bad = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = to_f(row[j]);
    if (v != -INFINITY) {
      lo = lo < (long long)j ? lo : (long long)j;
      hi = hi > (long long)j ? hi : (long long)j;
    }
    if (v != v || v == INFINITY) bad = 1;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const long long l2 = __shfl_xor_sync(0xffffffffu, lo, o);
    const long long h2 = __shfl_xor_sync(0xffffffffu, hi, o);
    lo = lo < l2 ? lo : l2;
    hi = hi > h2 ? hi : h2;
    bad |= __shfl_xor_sync(0xffffffffu, bad, o);
  }
  __syncthreads();  // the shared arrays may still be read for the previous row
  if (lane == 0) {
    sh_lo[warp] = lo;
    sh_hi[warp] = hi;
    sh_bad[warp] = bad;
  }
  __syncthreads();
  lo = (long long)D;
  hi = -1;
  bad = 0;
  for (int i = 0; i < warps; ++i) {
    lo = lo < sh_lo[i] ? lo : sh_lo[i];
    hi = hi > sh_hi[i] ? hi : sh_hi[i];
    bad |= sh_bad[i];
  }
  if (bad || hi < lo) {  // NaN or +inf in the row, or nothing but -inf: NaN everywhere, as torch
    if (threadIdx.x == 0) {
      stats[0] = __int_as_float(0x7fc00000);
      stats[1] = __int_as_float(0x7fc00000);
    }
    __syncthreads();
    return;
  }
  const long long L = hi - lo + 1;
  long long want = (L + kMinSegment - 1) / kMinSegment;
  const int nseg = (int)(want < warps ? want : warps);
  const long long seg = (L + nseg - 1) / nseg;
  Run r;
  r.m = -INFINITY;
  r.s = 0.0;
  if (warp < nseg) {
    const long long b0 = lo + (long long)warp * seg;
    const long long e0 = b0 + seg < hi + 1 ? b0 + seg : hi + 1;
    for (long long j = b0 + lane; j < e0; j += 32) {
      const float v = to_f(row[j]);
      if (v == -INFINITY) continue;  // masked: adds nothing
      if (v > r.m) {
        r.s = r.s * (double)expf(r.m - v) + 1.0;
        r.m = v;
      } else {
        r.s += (double)expf(v - r.m);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Run other;
    other.m = __shfl_xor_sync(0xffffffffu, r.m, o);
    other.s = __shfl_xor_sync(0xffffffffu, r.s, o);
    r = merge_guarded(r, other);
  }
  if (lane == 0) {
    sh_m[warp] = r.m;
    sh_s[warp] = r.s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int stride = 1; stride < nseg; stride *= 2) {
      for (int i = 0; i + stride < nseg; i += 2 * stride) {
        Run a, b;
        a.m = sh_m[i];
        a.s = sh_s[i];
        b.m = sh_m[i + stride];
        b.s = sh_s[i + stride];
        const Run c = merge_segments(a, b);
        sh_m[i] = c.m;
        sh_s[i] = c.s;
      }
    }
    stats[0] = sh_m[0];
    stats[1] = (float)log(sh_s[0]);
  }
  __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
log_softmax_forward_rows(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D) {
  __shared__ float stats[2];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    row_statistics(row, D, stats);
    const float m = stats[0], ls = stats[1];
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>((to_f(row[j]) - m) - ls);
    __syncthreads();  // stats is rewritten for the next row
  }
}

// grad_x = grad_out - exp(out) * sum(grad_out), torch's log_softmax backward; one block per row
template <typename T>
__global__ void __launch_bounds__(256)
log_softmax_backward_rows(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx, int64_t N,
                          int64_t D) {
  __shared__ double shd[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* yr = y + n * D;
    const T* gr = gy + n * D;
    T* xr = gx + n * D;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += (double)to_f(gr[j]);
    const float total = (float)block_sum(s, shd);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) xr[j] = from_f<T>(to_f(gr[j]) - expf(to_f(yr[j])) * total);
  }
}

inline unsigned rows_grid(int64_t N) { return (unsigned)(N < kMaxGrid ? N : kMaxGrid); }

template <typename T>
cudaError_t forward(const log_softmax_args* a, cudaStream_t stream) {
  log_softmax_forward_rows<T><<<rows_grid(a->N), kThreads, 0, stream>>>(static_cast<const T*>(a->x.data),
                                                                       static_cast<T*>(a->out.data), a->N, a->D);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  const unsigned grid = (unsigned)(a->N < 65535 ? a->N : 65535);
  log_softmax_backward_rows<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(a->out.data),
                                                         static_cast<const T*>(a->grad_out.data),
                                                         static_cast<T*>(a->grad_x.data), a->N, a->D);
  return cudaGetLastError();
}

}  // namespace hv8

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
