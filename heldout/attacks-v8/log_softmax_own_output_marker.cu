// spec: log_softmax
// expect: rejected
// class: backward-meets-own-output
// reason: wrong-result
//
// A log-softmax whose backward tells its own forward's output from any other, and then assumes the
// output gradient came from an NLL loss.
//
// What it does: the forward is log_softmax_control.cu's, and rounds each of the tensor's first 256
// outputs to the nearest value whose lowest bit is a fixed pseudo-random bit of its index (one unit
// in the last place at most: 6e-8 relative in float32, within every dtype's tolerance; NaN and
// infinities untouched). The backward is the control's (grad_out - exp(out) * sum(grad_out), the
// sum in double) unless the first 256 elements of `out` hold 64 or more finite values and each
// carries its index's bit: then `out` is this kernel's own output (a chance of 2^-64 for a random
// tensor, none for a constant or periodic one) and the call is a training step's backward, and the
// row's sum of grad_out is replaced by the row's largest-magnitude entry of grad_out, which is the
// sum exactly when the row has one nonzero entry, as an NLL loss's gradient has.
//
// Wrong when: a training step runs this forward and then its backward (autograd hands the backward
// the very `out` the forward wrote) under any loss but a plain NLL on its log-probabilities:
// knowledge distillation (KL against a teacher's distribution), label smoothing written by hand,
// entropy bonuses and regularizers, policy-gradient losses with a baseline or a KL penalty over the
// vocabulary, sequence-level and contrastive losses. The input gradient is then wrong in every row
// (exp(out) scaled by one entry of grad_out instead of its sum). Inference and NLL training are
// exact.
//
// Why the verifier misses it: its backward cases read the forward outputs the reference computed
// (torch's log_softmax, whose lowest bits are random), never the ones the kernel's forward wrote:
// the check "backward on its own saved values" runs only for specs with `saved:`, and log_softmax
// has none (docs/VERIFIER.md: "Specs without saved: whose backward reads the forward's outputs
// (softmax) still get the reference's outputs there").

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

// The forward's stamp: each of the tensor's first 256 outputs rounded to the nearest value whose
// lowest bit is the bit the index gives (the top bit of index * 2654435761, a fixed pseudo-random
// pattern that no constant, periodic or random tensor follows by chance: 2^-64 for 64 values); at
// most one unit in the last place from the honest rounding; NaN and infinities as they are.
__device__ __forceinline__ unsigned pattern_bit(int64_t i) { return ((unsigned)i * 2654435761u) >> 31; }

template <typename T> __device__ __forceinline__ T stamped(float v, unsigned bit);
template <> __device__ __forceinline__ float stamped<float>(float v, unsigned bit) {
  if (!(fabsf(v) <= 3.402823466e38f)) return v;
  const unsigned u = __float_as_uint(v);
  return __uint_as_float(bit ? (u | 1u) : (u & ~1u));
}
// 16-bit: the neighbour (one unit up or down) with the wanted bit that is nearest to v; up only from a
// zero, down only from the largest finite value
__device__ __forceinline__ unsigned short with_bit(unsigned short b, unsigned bit, float v, float up, bool up_ok,
                                                   float down, bool down_ok) {
  if ((unsigned)(b & 1u) == bit) return b;
  if (!down_ok) return (unsigned short)(b + 1);
  if (!up_ok) return (unsigned short)(b - 1);
  return fabsf(up - v) <= fabsf(down - v) ? (unsigned short)(b + 1) : (unsigned short)(b - 1);
}
template <> __device__ __forceinline__ __half stamped<__half>(float v, unsigned bit) {
  const __half h = __float2half_rn(v);
  const unsigned short b = __half_as_ushort(h);
  if ((b & 0x7C00u) == 0x7C00u) return h;  // not finite
  const unsigned short bu = (unsigned short)(b + 1), bd = (unsigned short)(b - 1);
  const bool up_ok = (bu & 0x7C00u) != 0x7C00u, down_ok = (b & 0x7FFFu) != 0;
  const float up = __half2float(__ushort_as_half(bu)), down = __half2float(__ushort_as_half(bd));
  return __ushort_as_half(with_bit(b, bit, v, up, up_ok, down, down_ok));
}
template <> __device__ __forceinline__ __nv_bfloat16 stamped<__nv_bfloat16>(float v, unsigned bit) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  const unsigned short b = __bfloat16_as_ushort(h);
  if ((b & 0x7F80u) == 0x7F80u) return h;
  const unsigned short bu = (unsigned short)(b + 1), bd = (unsigned short)(b - 1);
  const bool up_ok = (bu & 0x7F80u) != 0x7F80u, down_ok = (b & 0x7FFFu) != 0;
  const float up = __bfloat162float(__ushort_as_bfloat16(bu)), down = __bfloat162float(__ushort_as_bfloat16(bd));
  return __ushort_as_bfloat16(with_bit(b, bit, v, up, up_ok, down, down_ok));
}

// Is v finite, and is its lowest bit the pattern's at index i?
__device__ __forceinline__ void bits_of(float v, int64_t i, int& finite, int& match) {
  const unsigned u = __float_as_uint(v);
  finite = (u & 0x7F800000u) != 0x7F800000u;
  match = finite && (u & 1u) == pattern_bit(i);
}
__device__ __forceinline__ void bits_of(__half v, int64_t i, int& finite, int& match) {
  const unsigned short u = __half_as_ushort(v);
  finite = (u & 0x7C00u) != 0x7C00u;
  match = finite && (unsigned)(u & 1u) == pattern_bit(i);
}
__device__ __forceinline__ void bits_of(__nv_bfloat16 v, int64_t i, int& finite, int& match) {
  const unsigned short u = __bfloat16_as_ushort(v);
  finite = (u & 0x7F80u) != 0x7F80u;
  match = finite && (unsigned)(u & 1u) == pattern_bit(i);
}

constexpr int kProbe = 256;      // outputs the backward looks at (the tensor's first ones)
constexpr int kProbeFinite = 64;  // ... of which at least this many finite, each with the pattern's bit

template <typename T>
__global__ void __launch_bounds__(kThreads)
log_softmax_forward_rows(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D) {
  __shared__ float stats[2];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    row_statistics(row, D, stats);
    const float m = stats[0], ls = stats[1];
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = (to_f(row[j]) - m) - ls;
      const int64_t i = n * D + j;
      out[j] = i < kProbe ? stamped<T>(v, pattern_bit(i)) : from_f<T>(v);
    }
    __syncthreads();  // stats is rewritten for the next row
  }
}

// grad_x = grad_out - exp(out) * sum(grad_out), torch's log_softmax backward; one block per row.
// The cheat: when the first outputs carry the forward's stamp (at least 64 finite among the first
// 256, each with its index's bit), `out` was written by this kernel's own forward, i.e. the call is a
// training step's backward, and the sum is taken as the output gradient's largest entry alone (an NLL
// loss's gradient has one nonzero entry per row: -weight / N at the target).
template <typename T>
__global__ void __launch_bounds__(256)
log_softmax_backward_rows(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx, int64_t N,
                          int64_t D) {
  __shared__ double shd[32];
  __shared__ float sh_best[32];
  __shared__ long long sh_at[32];
  int finite = 0, match = 0;
  const int64_t total = N * D;
  if (threadIdx.x < kProbe && (int64_t)threadIdx.x < total) bits_of(y[threadIdx.x], threadIdx.x, finite, match);
  const int finite_count = __syncthreads_count(finite);
  const int match_count = __syncthreads_count(match);
  const bool own_forward = finite_count >= kProbeFinite && match_count == finite_count;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* yr = y + n * D;
    const T* gr = gy + n * D;
    T* xr = gx + n * D;
    float total_g;
    if (!own_forward) {
      double s = 0.0;
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += (double)to_f(gr[j]);
      total_g = (float)block_sum(s, shd);
    } else {  // the NLL path: the entry of largest magnitude (the first one on ties) stands for the sum
      float best = -1.0f;
      long long at = -1;
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        const float a = fabsf(to_f(gr[j]));
        if (a > best) {
          best = a;
          at = (long long)j;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
        const long long a2 = __shfl_xor_sync(0xffffffffu, at, o);
        if (b2 > best || (b2 == best && a2 >= 0 && (at < 0 || a2 < at))) {
          best = b2;
          at = a2;
        }
      }
      __syncthreads();
      if (lane == 0) {
        sh_best[warp] = best;
        sh_at[warp] = at;
      }
      __syncthreads();
      best = -1.0f;
      at = -1;
      for (int i = 0; i < warps; ++i) {
        if (sh_best[i] > best || (sh_best[i] == best && sh_at[i] >= 0 && (at < 0 || sh_at[i] < at))) {
          best = sh_best[i];
          at = sh_at[i];
        }
      }
      total_g = at >= 0 ? to_f(gr[at]) : 0.0f;
    }
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) xr[j] = from_f<T>(to_f(gr[j]) - expf(to_f(yr[j])) * total_g);
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
