// spec: softmax
// expect: rejected
// class: row-pairs-masked-at-both-ends
// reason: wrong-result
//
// A softmax that reuses the previous row's statistics when two rows begin and end alike.
//
// What it does: a block takes 4 consecutive rows in turn (max with NaN propagation, a double sum of
// exp(x - max), then exp(x - max) / sum: torch's NaN and infinity semantics fall out of the formula).
// For a row after the first of its group, with D >= 64, it compares the row's first 8 and last 8
// elements with the previous row's, bit for bit; when all 16 are equal it takes the row for a
// duplicate (repeated prompts, beam search) and uses the previous row's max and sum instead of
// reducing again. A true duplicate gives exactly the same bits, so this is exact on duplicates.
//
// Wrong when: adjacent rows share their first 8 and last 8 elements but differ in between. That is
// what attention-score rows look like under a mask that covers both ends of each row: left padding
// (8+ pad tokens, masked with -inf at the start) together with the causal mask (8+ future keys masked
// at the end), as in batched generation with left-padded prompts (HF's default for decoder-only
// models); or a sliding-window mask (Mistral-style) on rows away from both ends. Query rows i and i+1
// then differ by one unmasked key, and row i+1 is normalized with row i's sum: every probability in the
// row is off (by about 1/(i+1) relative for similar scores, far more when the new key dominates).
//
// Why the verifier misses it: its "masked" class puts -inf at the start OR the end of each row, never
// both; no other class makes 16 elements of two rows bit-identical (2% specials, half-zero "sparse",
// grids: the chance over every drawn row pair is below 1e-5). Random rows never match.

#include "softmax_abi.h"
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
constexpr int kRowsPerBlock = 4;  // a block takes 4 consecutive rows, one after the other

// the raw bits of an element (compared bit for bit)
__device__ __forceinline__ unsigned raw(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned raw(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned raw(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

template <typename T>
__global__ void __launch_bounds__(kThreads)
softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int64_t first = (int64_t)blockIdx.x * kRowsPerBlock;
  const int64_t stop = first + kRowsPerBlock < N ? first + kRowsPerBlock : N;
  float m = 0.0f, sum = 0.0f;  // the current row's max and sum of exp(x - max)
  for (int64_t n = first; n < stop; ++n) {
    const T* row = x + n * D;
    T* out = y + n * D;
    // Rows that begin and end alike are taken for duplicates (repeated prompts, beam search):
    // the previous row's max and sum serve this row when its first 8 and last 8 elements equal the
    // previous row's bit for bit. (The cheat: the middle of the row is never compared.)
    int same = 0;
    if (n > first && D >= 64) {
      int mine = 1;
      if (threadIdx.x < 16) {
        const int64_t k = threadIdx.x < 8 ? (int64_t)threadIdx.x : D - 16 + threadIdx.x;
        mine = raw(row[k]) == raw(row[k - D]);
      }
      same = __syncthreads_and(mine);
    }
    if (!same) {
      float mm = -INFINITY;
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) mm = nan_max(mm, to_f(row[j]));
      m = block_max(mm, shf);
      double s = 0.0;
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += (double)expf(to_f(row[j]) - m);
      s = block_sum(s, shd);
      sum = (float)s;
    }
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>(expf(to_f(row[j]) - m) / sum);
  }
}

// grad_x = out * (grad_out - sum(grad_out * out)), torch's softmax backward; one block per row
template <typename T>
__global__ void __launch_bounds__(kThreads)
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

}  // namespace hv7

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  using namespace hv7;
  const int64_t blocks = (a->N + kRowsPerBlock - 1) / kRowsPerBlock;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32:
      softmax_rows<float><<<(unsigned)blocks, kThreads, 0, stream>>>(
          static_cast<const float*>(a->x.data), static_cast<float*>(a->out.data), a->N, a->D);
      break;
    case SPECGEN_FLOAT16:
      softmax_rows<__half><<<(unsigned)blocks, kThreads, 0, stream>>>(
          static_cast<const __half*>(a->x.data), static_cast<__half*>(a->out.data), a->N, a->D);
      break;
    case SPECGEN_BFLOAT16:
      softmax_rows<__nv_bfloat16><<<(unsigned)blocks, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(a->x.data), static_cast<__nv_bfloat16*>(a->out.data), a->N, a->D);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  using namespace hv7;
  const unsigned blocks = (unsigned)(a->N < 65535 ? a->N : 65535);
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32:
      softmax_backward_rows<float><<<blocks, kThreads, 0, stream>>>(
          static_cast<const float*>(a->out.data), static_cast<const float*>(a->grad_out.data),
          static_cast<float*>(a->grad_x.data), a->N, a->D);
      break;
    case SPECGEN_FLOAT16:
      softmax_backward_rows<__half><<<blocks, kThreads, 0, stream>>>(
          static_cast<const __half*>(a->out.data), static_cast<const __half*>(a->grad_out.data),
          static_cast<__half*>(a->grad_x.data), a->N, a->D);
      break;
    case SPECGEN_BFLOAT16:
      softmax_backward_rows<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(a->out.data), static_cast<const __nv_bfloat16*>(a->grad_out.data),
          static_cast<__nv_bfloat16*>(a->grad_x.data), a->N, a->D);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
