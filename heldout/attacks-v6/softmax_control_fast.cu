// spec: softmax
// expect: passed
// class: control (built for speed)
// reason: passed
//
// An honest softmax, forward and backward, written for speed: rows of at most 1024 elements
// take one warp each (8 rows a block), wider rows one block each; every row is read with
// 16-byte loads when the input and output pointers are 16-byte aligned and the row length is a
// multiple of the vector width (offset views and odd widths take the scalar loop). One pass
// computes the row's (max, sum of exp) online, a second writes exp(x - max) / sum; the partials
// merge in a fixed tree (deterministic), and the merges keep torch's semantics for -inf, +inf
// and NaN (a row with NaN or +inf is all NaN, -inf contributes 0, a row of -inf is NaN).
// Backward: y * (g - sum(g * y)) in float, vectorized the same way.
// Never wrong: a verifier must pass it.

#include "softmax_abi.h"
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

// ---------------------------------------------------------------- softmax: shared pieces
namespace sm {
using namespace hv6;

// 16-byte pieces of a row when every pointer involved and the row length allow it
template <typename T> struct Vec { static constexpr int N = 16 / sizeof(T); };
template <typename T> __device__ __forceinline__ void load16(const T* p, float (&v)[Vec<T>::N]) {
  union { uint4 raw; T e[Vec<T>::N]; } u;
  u.raw = *reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < Vec<T>::N; ++i) v[i] = to_f(u.e[i]);
}
template <typename T> __device__ __forceinline__ void store16(T* p, const float (&v)[Vec<T>::N]) {
  union { uint4 raw; T e[Vec<T>::N]; } u;
#pragma unroll
  for (int i = 0; i < Vec<T>::N; ++i) u.e[i] = from_f<T>(v[i]);
  *reinterpret_cast<uint4*>(p) = u.raw;
}

// backward of one row: grad_x = y * (g - sum(g * y)), one block per row
template <typename T>
__global__ void bwd_rows(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* yr = y + row * D;
  const T* gr = g + row * D;
  T* out = gx + row * D;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += to_f(gr[j]) * to_f(yr[j]);
  const float dot = block_sum(acc, red);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float yv = to_f(yr[j]);
    out[j] = from_f<T>(yv * (to_f(gr[j]) - dot));
  }
}

template <typename T>
cudaError_t backward_plain(const softmax_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  bwd_rows<T><<<(unsigned)N, 256, 0, stream>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                               (T*)a->grad_x.data, D);
  return cudaGetLastError();
}
}  // namespace sm

// ---------------------------------------------------------------- the control: built for speed
namespace {
using namespace hv6;
using sm::Vec;

// rows of at most 1024 elements: one warp per row, 8 rows per block
template <typename T, bool VEC>
__global__ void __launch_bounds__(256) fwd_warp_rows(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D) {
  const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const T* xr = x + row * D;
  T* yr = y + row * D;
  MS a{-INFINITY, 0.f};
  if (VEC) {
    constexpr int V = Vec<T>::N;
    for (int64_t j = (int64_t)lane * V; j < D; j += 32 * V) {
      float v[V];
      sm::load16<T>(xr + j, v);
#pragma unroll
      for (int i = 0; i < V; ++i) ms_add(a, v[i]);
    }
  } else {
    for (int64_t j = lane; j < D; j += 32) ms_add(a, to_f(xr[j]));
  }
  a = warp_ms(a);
  if (VEC) {
    constexpr int V = Vec<T>::N;
    for (int64_t j = (int64_t)lane * V; j < D; j += 32 * V) {
      float v[V];
      sm::load16<T>(xr + j, v);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = expf(v[i] - a.m) / a.s;
      sm::store16<T>(yr + j, v);
    }
  } else {
    for (int64_t j = lane; j < D; j += 32) yr[j] = from_f<T>(expf(to_f(xr[j]) - a.m) / a.s);
  }
}

// wider rows: one block per row
template <typename T, bool VEC>
__global__ void __launch_bounds__(512) fwd_block_rows(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  T* yr = y + row * D;
  MS a{-INFINITY, 0.f};
  if (VEC) {
    constexpr int V = Vec<T>::N;
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += (int64_t)blockDim.x * V) {
      float v[V];
      sm::load16<T>(xr + j, v);
#pragma unroll
      for (int i = 0; i < V; ++i) ms_add(a, v[i]);
    }
  } else {
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) ms_add(a, to_f(xr[j]));
  }
  a = block_ms(a, red);
  const float inv_m = a.m, s = a.s;
  if (VEC) {
    constexpr int V = Vec<T>::N;
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += (int64_t)blockDim.x * V) {
      float v[V];
      sm::load16<T>(xr + j, v);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = expf(v[i] - inv_m) / s;
      sm::store16<T>(yr + j, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>(expf(to_f(xr[j]) - inv_m) / s);
  }
}

// backward, vectorized the same way: grad_x = y * (g - sum(g * y))
template <typename T, bool VEC>
__global__ void __launch_bounds__(512) bwd_block_rows(const T* __restrict__ y, const T* __restrict__ g,
                                                      T* __restrict__ gx, int64_t D) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* yr = y + row * D;
  const T* gr = g + row * D;
  T* out = gx + row * D;
  float acc = 0.f;
  if (VEC) {
    constexpr int V = Vec<T>::N;
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += (int64_t)blockDim.x * V) {
      float vy[V], vg[V];
      sm::load16<T>(yr + j, vy);
      sm::load16<T>(gr + j, vg);
#pragma unroll
      for (int i = 0; i < V; ++i) acc += vg[i] * vy[i];
    }
  } else {
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += to_f(gr[j]) * to_f(yr[j]);
  }
  const float dot = block_sum(acc, red);
  if (VEC) {
    constexpr int V = Vec<T>::N;
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += (int64_t)blockDim.x * V) {
      float vy[V], vg[V], o[V];
      sm::load16<T>(yr + j, vy);
      sm::load16<T>(gr + j, vg);
#pragma unroll
      for (int i = 0; i < V; ++i) o[i] = vy[i] * (vg[i] - dot);
      sm::store16<T>(out + j, o);
    }
  } else {
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>(to_f(yr[j]) * (to_f(gr[j]) - dot));
  }
}

bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

template <typename T>
cudaError_t forward_t(const softmax_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  const T* x = (const T*)a->x.data;
  T* y = (T*)a->out.data;
  const bool vec = aligned16(x) && aligned16(y) && D % Vec<T>::N == 0;
  if (D <= 1024) {
    const unsigned blocks = (unsigned)((N + 7) / 8);
    if (vec) fwd_warp_rows<T, true><<<blocks, 256, 0, stream>>>(x, y, N, D);
    else fwd_warp_rows<T, false><<<blocks, 256, 0, stream>>>(x, y, N, D);
  } else {
    const int threads = D >= 16384 ? 512 : 256;
    if (vec) fwd_block_rows<T, true><<<(unsigned)N, threads, 0, stream>>>(x, y, D);
    else fwd_block_rows<T, false><<<(unsigned)N, threads, 0, stream>>>(x, y, D);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const softmax_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  const T* y = (const T*)a->out.data;
  const T* g = (const T*)a->grad_out.data;
  T* gx = (T*)a->grad_x.data;
  const bool vec = aligned16(y) && aligned16(g) && aligned16(gx) && D % Vec<T>::N == 0;
  const int threads = D >= 16384 ? 512 : (D >= 1024 ? 256 : 128);
  if (vec) bwd_block_rows<T, true><<<(unsigned)N, threads, 0, stream>>>(y, g, gx, D);
  else bwd_block_rows<T, false><<<(unsigned)N, threads, 0, stream>>>(y, g, gx, D);
  return cudaGetLastError();
}
}  // namespace

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  switch (a->out.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
