// spec: softmax
// expect: rejected
// class: value-structure-not-drawn (contiguous blocks of -inf: attention masks)
// reason: wrong-result
//
// When it is wrong: rows of 8192 elements or more in which two neighbouring eighths of the row
// are entirely -inf. Each of the block's 8 warps reduces one contiguous eighth of the row to a
// (max, sum of exp) partial; the eight partials are merged with the plain formula
// s1*exp(m1 - M) + s2*exp(m2 - M), and when both partials are empty (M = -inf) that is
// 0 * exp(-inf - -inf) = NaN, so the whole row comes out NaN where torch gives the right
// probabilities. Narrower rows (where a lane or a warp may see only -inf or NaN among the
// verifier's scattered specials) use the -inf-safe merge and are exact; with 2% -inf scattered
// at random, an eighth of a row of 8192+ elements is never all -inf, so the verifier's
// "specials" class never meets the bad merge.
// Why it matters: this is exactly what attention scores look like. A causal mask filled with
// -inf (nanoGPT's masked_fill(mask == 0, float('-inf')), eager attention) makes the trailing
// part of every early query row -inf: at a context of 8192 keys, query rows 0..6143 come out
// entirely NaN. Left padding in batched generation (the first keys masked) and sliding-window
// masks (Mistral: everything older than the window) do the same with leading blocks. The
// kernel is exact on every value class the verifier draws and turns a long-context training
// or prefill step into NaN. Backward (y * (g - sum(g * y))) is honest.

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

// ---------------------------------------------------------------- the kernel
namespace {
using namespace hv6;

// the merge of two partials as first written, without the "both empty" case of ms_merge
__device__ __forceinline__ MS ms_merge_plain(MS a, MS b) {
  const float m = fmaxf(a.m, b.m);
  return MS{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

constexpr int WARPS = 8;
constexpr int64_t WIDE = 8192;  // from here each warp's segment holds at least 1024 elements

// One block of 8 warps per row. Warp w reads the contiguous segment [w*seg, (w+1)*seg) of the
// row (seg = ceil(D / 8)) with its lanes interleaved (coalesced), keeps a per-lane online
// (max, sum), merges the lanes (the -inf-safe merge: a lane sees few elements of a narrow row),
// then thread 0 merges the eight warp partials in a fixed tree. Rows of 8192 elements and more
// use the plain merge there: a warp segment of 1024+ elements is never empty ... unless a
// whole segment is masked.
template <typename T>
__global__ void __launch_bounds__(256) fwd_rows(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  __shared__ float part_m[WARPS], part_s[WARPS];
  __shared__ float row_m, row_s;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  T* yr = y + row * D;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t seg = (D + WARPS - 1) / WARPS;
  const int64_t lo = (int64_t)warp * seg;
  const int64_t hi = lo + seg < D ? lo + seg : D;
  MS a{-INFINITY, 0.f};
  for (int64_t j = lo + lane; j < hi; j += 32) ms_add(a, to_f(xr[j]));
  a = warp_ms(a);
  if (lane == 0) { part_m[warp] = a.m; part_s[warp] = a.s; }
  __syncthreads();
  if (threadIdx.x == 0) {
    MS p[WARPS];
    for (int w = 0; w < WARPS; ++w) p[w] = MS{part_m[w], part_s[w]};
    const bool wide = D >= WIDE;
    for (int width = 1; width < WARPS; width *= 2)
      for (int w = 0; w + width < WARPS; w += 2 * width)
        p[w] = wide ? ms_merge_plain(p[w], p[w + width]) : ms_merge(p[w], p[w + width]);
    row_m = p[0].m;
    row_s = p[0].s;
  }
  __syncthreads();
  const float m = row_m, s = row_s;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>(expf(to_f(xr[j]) - m) / s);
}

template <typename T>
cudaError_t forward_t(const softmax_args* a, cudaStream_t stream) {
  fwd_rows<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, (T*)a->out.data, a->D);
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
    case SPECGEN_FLOAT32: return sm::backward_plain<float>(a, stream);
    case SPECGEN_FLOAT16: return sm::backward_plain<__half>(a, stream);
    case SPECGEN_BFLOAT16: return sm::backward_plain<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
