// spec: softmax
// expect: rejected
// class: value-classes-at-the-other-benchmark-shapes
// reason: wrong-result
//
// A softmax whose one-pass schedule for wide rows in large calls NaNs rows masked over two sibling
// segments.
//
// What it does: softmax_control_fast.cu's kernels for every call but one kind: rows of 65536
// elements or more in calls of 1024 rows or more take a one-pass schedule. Pass 1 looks for NaN or
// +inf (the row is NaN everywhere, as torch gives it) and for a row of -inf only (NaN too); the row
// is cut into 32 contiguous segments, one per warp, each lane an online (max, sum of exp(x - max))
// in double over its elements (-inf skipped), the lanes merged with a guarded butterfly; then the
// segments' pairs are merged in a pairwise tree with the plain formula, which is NaN when two
// sibling segments are -inf throughout; the write pass is exp(x - max) / sum. With no such pair the
// result is exact.
//
// Wrong when: a call of 1024 rows or more has rows 65536 or more wide with a run of -inf covering
// two sibling segments (4096 elements each at 131072): causal attention scores over long contexts
// computed with an explicit softmax (eager and "math" attention at 64k-128k keys, chunked prefill:
// every query row but the last few thousand has a -inf run of tens of thousands at its end),
// sliding-window rows, and vocabulary rows with a masked range (a language's or a grammar's
// disallowed ids) over a batch. Those rows come out NaN.
//
// Why the verifier misses it: the value classes meet wide rows only in small cases (the widest row
// in every class, a few rows: under 1024) and meet large calls only at the first benchmark shape
// (N=16384, D=8192: classes at scale, version 8). The other benchmark shapes (2048 x 65536, 1024 x
// 131072), the tops of the ranges, their twins, the timed calls and the case past 2^31 elements
// draw normal and uniform values only.

#include "softmax_abi.h"
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

template <typename T> struct Lanes { static constexpr int W = 16 / (int)sizeof(T); };  // elements per 16 bytes

template <typename T>
__device__ __forceinline__ void load16(const T* p, float* dst) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < Lanes<T>::W; ++i) dst[i] = to_f(e[i]);
}

template <typename T>
__device__ __forceinline__ void store16(T* p, const float* src) {
  uint4 u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < Lanes<T>::W; ++i) e[i] = from_f<T>(src[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

// The row in registers: VPT elements per thread. Vector mode: thread t holds the 16-byte vectors
// t, t + THREADS, ...; element mode: the elements t, t + THREADS, ... Missing elements are -inf,
// which adds nothing to the sum whatever the max (and the row's result is NaN anyway when the max is
// -inf or +inf or NaN).
template <typename T, int VPT, int THREADS>
__global__ void __launch_bounds__(THREADS)
softmax_cached(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D, int vec) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  constexpr int W = Lanes<T>::W;
  float v[VPT];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    if (vec) {
#pragma unroll
      for (int k = 0; k < VPT / W; ++k) {
        const int64_t j0 = ((int64_t)threadIdx.x + (int64_t)k * THREADS) * W;
        if (j0 < D) {
          load16(row + j0, v + k * W);
        } else {
#pragma unroll
          for (int i = 0; i < W; ++i) v[k * W + i] = -INFINITY;
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int64_t j = (int64_t)threadIdx.x + (int64_t)k * THREADS;
        v[k] = j < D ? to_f(row[j]) : -INFINITY;
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < VPT; ++k) m = nan_max(m, v[k]);
    m = block_max(m, shf);
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      v[k] = expf(v[k] - m);
      s += (double)v[k];
    }
    const float sum = (float)block_sum(s, shd);
    if (vec) {
#pragma unroll
      for (int k = 0; k < VPT / W; ++k) {
        const int64_t j0 = ((int64_t)threadIdx.x + (int64_t)k * THREADS) * W;
        if (j0 < D) {
          float o[W];
#pragma unroll
          for (int i = 0; i < W; ++i) o[i] = v[k * W + i] / sum;
          store16(out + j0, o);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int64_t j = (int64_t)threadIdx.x + (int64_t)k * THREADS;
        if (j < D) out[j] = from_f<T>(v[k] / sum);
      }
    }
  }
}

// Rows wider than the register cache: max, sum, write, each a pass over the row.
template <typename T>
__global__ void __launch_bounds__(1024)
softmax_wide(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D, int vec) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  constexpr int W = Lanes<T>::W;
  const int64_t nv = D / W;  // whole vectors (vec mode: D % W == 0)
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    float m = -INFINITY;
    if (vec) {
      for (int64_t q = threadIdx.x; q < nv; q += blockDim.x) {
        float t[W];
        load16(row + q * W, t);
#pragma unroll
        for (int i = 0; i < W; ++i) m = nan_max(m, t[i]);
      }
    } else {
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = nan_max(m, to_f(row[j]));
    }
    m = block_max(m, shf);
    double s = 0.0;
    if (vec) {
      for (int64_t q = threadIdx.x; q < nv; q += blockDim.x) {
        float t[W];
        load16(row + q * W, t);
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < W; ++i) part += expf(t[i] - m);
        s += (double)part;
      }
    } else {
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += (double)expf(to_f(row[j]) - m);
    }
    const float sum = (float)block_sum(s, shd);
    if (vec) {
      for (int64_t q = threadIdx.x; q < nv; q += blockDim.x) {
        float t[W];
        load16(row + q * W, t);
#pragma unroll
        for (int i = 0; i < W; ++i) t[i] = expf(t[i] - m) / sum;
        store16(out + q * W, t);
      }
    } else {
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>(expf(to_f(row[j]) - m) / sum);
    }
  }
}

// Wide rows in calls of many rows: the row's statistics in one pass, then the write pass. Pass 1 looks
// for NaN or +inf (the row is NaN everywhere then, as torch gives it) and for a row of nothing but
// -inf (NaN too); then the row is cut into 32 contiguous segments, one per warp, each lane an online
// (max, sum of exp(x - max)) in double over its elements of the segment (-inf skipped), the lanes
// merged with a guarded butterfly. The cheat: the segments' pairs are merged in a pairwise tree with
// the plain formula, which is NaN when two sibling segments are -inf throughout.
constexpr int64_t kWideRow = 65536;   // rows this wide ...
constexpr int64_t kManyRows = 1024;   // ... in calls of this many rows take the one-pass schedule

struct Run {
  float m;
  double s;
};

__device__ __forceinline__ Run merge_guarded(Run a, Run b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  Run r;
  r.m = m;
  r.s = a.s * (double)expf(a.m - m) + b.s * (double)expf(b.m - m);
  return r;
}

__device__ __forceinline__ Run merge_plain(Run a, Run b) {
  const float m = fmaxf(a.m, b.m);
  Run r;
  r.m = m;
  r.s = a.s * (double)expf(a.m - m) + b.s * (double)expf(b.m - m);
  return r;
}

template <typename T>
__global__ void __launch_bounds__(1024)
softmax_one_pass(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D) {
  __shared__ int sh_flags[32];
  __shared__ float sh_m[32];
  __shared__ double sh_s[32];
  __shared__ float s_max, s_sum;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t seg = (D + warps - 1) / warps;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    int flags = 0;  // 1: NaN or +inf seen, 2: an element other than -inf seen
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = to_f(row[j]);
      if (v != v || v == INFINITY) flags |= 1;
      if (v != -INFINITY) flags |= 2;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) flags |= __shfl_xor_sync(0xffffffffu, flags, o);
    __syncthreads();
    if (lane == 0) sh_flags[warp] = flags;
    __syncthreads();
    flags = 0;
    for (int i = 0; i < warps; ++i) flags |= sh_flags[i];
    if ((flags & 1) || !(flags & 2)) {
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>(__int_as_float(0x7fc00000));
      continue;
    }
    Run r;
    r.m = -INFINITY;
    r.s = 0.0;
    const int64_t b0 = (int64_t)warp * seg, e0 = b0 + seg < D ? b0 + seg : D;
    for (int64_t j = b0 + lane; j < e0; j += 32) {
      const float v = to_f(row[j]);
      if (v == -INFINITY) continue;
      if (v > r.m) {
        r.s = r.s * (double)expf(r.m - v) + 1.0;
        r.m = v;
      } else {
        r.s += (double)expf(v - r.m);
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
      for (int stride = 1; stride < warps; stride *= 2) {
        for (int i = 0; i + stride < warps; i += 2 * stride) {
          Run a, b;
          a.m = sh_m[i];
          a.s = sh_s[i];
          b.m = sh_m[i + stride];
          b.s = sh_s[i + stride];
          const Run c = merge_plain(a, b);
          sh_m[i] = c.m;
          sh_s[i] = c.s;
        }
      }
      s_max = sh_m[0];
      s_sum = (float)sh_s[0];
    }
    __syncthreads();
    const float m = s_max, sum = s_sum;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>(expf(to_f(row[j]) - m) / sum);
  }
}

// grad_x = out * (grad_out - sum(grad_out * out)), torch's softmax backward; one block per row
template <typename T>
__global__ void __launch_bounds__(256)
softmax_backward_rows(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx, int64_t N, int64_t D) {
  __shared__ double shd[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* yr = y + n * D;
    const T* gr = gy + n * D;
    T* xr = gx + n * D;
    double dot = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += (double)to_f(gr[j]) * (double)to_f(yr[j]);
    const float d = (float)block_sum(dot, shd);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) xr[j] = from_f<T>(to_f(yr[j]) * (to_f(gr[j]) - d));
  }
}

template <typename T>
cudaError_t forward(const softmax_args* a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a->x.data);
  T* y = static_cast<T*>(a->out.data);
  const int64_t N = a->N, D = a->D;
  const int vec = ((uintptr_t)x % 16 == 0) && ((uintptr_t)y % 16 == 0) && ((D * (int64_t)sizeof(T)) % 16 == 0);
  const unsigned grid = (unsigned)(N < 65535 ? N : 65535);
  if (D <= 1024) {
    softmax_cached<T, 8, 128><<<grid, 128, 0, stream>>>(x, y, N, D, vec);
  } else if (D <= 4096) {
    softmax_cached<T, 16, 256><<<grid, 256, 0, stream>>>(x, y, N, D, vec);
  } else if (D <= 16384) {
    softmax_cached<T, 32, 512><<<grid, 512, 0, stream>>>(x, y, N, D, vec);
  } else if (D >= kWideRow && N >= kManyRows) {
    softmax_one_pass<T><<<grid, 1024, 0, stream>>>(x, y, N, D);
  } else {
    softmax_wide<T><<<grid, 1024, 0, stream>>>(x, y, N, D, vec);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const softmax_bwd_args* a, cudaStream_t stream) {
  const unsigned grid = (unsigned)(a->N < 65535 ? a->N : 65535);
  softmax_backward_rows<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(a->out.data),
                                                     static_cast<const T*>(a->grad_out.data),
                                                     static_cast<T*>(a->grad_x.data), a->N, a->D);
  return cudaGetLastError();
}

}  // namespace hv8

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
