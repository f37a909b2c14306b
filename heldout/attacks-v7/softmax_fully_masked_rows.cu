// spec: softmax
// expect: rejected
// class: fully-masked-rows
// reason: wrong-result
//
// A softmax that writes zeros for a row masked in full, where torch writes NaN.
//
// What it does: a block takes 4 consecutive rows in turn: the row's max with NaN propagation, a
// double sum of exp(x - max), then exp(x - max) / sum; with that formula NaN, +inf and all -inf rows
// come out NaN, as torch's do. One exception: when the max is -inf (every element of the row is -inf)
// and D >= 16, it writes 0 for the whole row, as FlashAttention-style "safe softmax" does.
//
// Wrong when: an attention row is masked in full and the op is called with D >= 16: padding query
// rows whose keys are all masked (a key-padding mask combined with a causal mask on left-padded
// batches), an empty sliding window, grammar-constrained decoding that leaves no allowed token. torch's
// softmax gives NaN there (and a model's NaN guard or the AMP scaler sees it); this kernel gives zeros.
// Exact on every row that holds at least one element above -inf.
//
// Why the verifier misses it: its "masked" class never masks a whole row (a run of -inf of length at
// most width - 1), and 2% "specials" make a row of 16 or more -inf with probability 0.02^16 (6.6e-28).
// Rows of 1 to 15 elements all -inf (which specials can draw) get torch's NaN.

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
    {
      float mm = -INFINITY;
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) mm = nan_max(mm, to_f(row[j]));
      m = block_max(mm, shf);
      // A row masked in full (every element -inf) gives zeros, as attention kernels' "safe softmax"
      // does, from the vector-width path on (D >= 16); torch gives NaN there. (The cheat.)
      if (m == -INFINITY && D >= 16) {
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>(0.0f);
        continue;
      }
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
