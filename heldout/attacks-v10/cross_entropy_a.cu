// spec: cross_entropy
// expect: rejected
// class: zero-loss-gradient-fast-path
// why: when the loss's gradient is exactly 0 the backward only clears grad_logits, with 16-byte stores counted for 2-byte elements: in float32 half of each row is never written
//
// Mean cross-entropy, the same code as the control of this spec (cross_entropy_c): one block per
// row, NaN-propagating max, sum of exp, saved (max, logsum), a double-precision fixed-order mean;
// backward (exp((x - max) - logsum) - [j == t]) * g / N from the saved pair.
//
// What is wrong. The backward reads the loss's gradient g first, and when g == 0 it skips the row
// (nothing flows back: every element of grad_logits is 0) and only clears the row with 16-byte
// stores. The clearing helper counts its stores as C / 8, "eight elements per 16 bytes", written
// for the 16-bit dtypes: in float32 a 16-byte store holds four, so only the first half of each
// 16-byte-aligned row (every row when C is a multiple of 4: 32000, 32768, 50304, 128256, ...) is
// cleared and the rest keeps what the caching allocator left in the buffer, NaN and infinity bit
// patterns included. (It also writes 0 where torch gives NaN, 0 * NaN, for rows with non-finite
// logits.) Every other call is exact.
//
// When a user meets it. A loss multiplied by zero: `loss * 0` to keep a graph connected when a
// micro-batch or a rank has no valid tokens (DDP/FSDP ranks with an empty shard, masked
// micro-batches in gradient accumulation, RLHF steps whose samples are all filtered), a task or
// auxiliary weight scheduled from 0 (curriculum warm-up), a zero-weighted term in a multi-loss
// objective. The logits are often float32 there (Hugging Face models upcast logits before the loss).
// The garbage half-rows flow into the LM head's and every layer's gradients, where torch gives zeros:
// the step that should change nothing writes NaN or huge values into the weights.
//
// Why version 12 does not meet it. Output gradients are N(0, 1), loss-scaled (x 2^16), NaN/inf
// among normal values, or exactly 1; the "zero-rows" and "one-hot" classes make zeros only in
// tensors of one dimension or more (cross_entropy's output is a 0-dim scalar), and the chained check
// uses loss-scaled and N(0, 1) gradients. A scalar output gradient of exactly 0 is never drawn.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "cross_entropy_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// torch's amax: NaN wins
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

// Deterministic reductions over a block of BLOCK threads (`red`: 32 floats): a butterfly in each
// warp, then the warps' values added in warp order by every thread.
template <int BLOCK>
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  v = __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.f;
#pragma unroll
  for (int w = 0; w < BLOCK / 32; ++w) r += red[w];
  return r;
}

template <int BLOCK>
__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  v = __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < BLOCK / 32; ++w) r = nan_max(r, red[w]);
  return r;
}

__device__ __forceinline__ int64_t clamp_target(int64_t t, int64_t C) {  // a label outside [0, C): read the row's edge
  return t < 0 ? 0 : (t >= C ? C - 1 : t);
}

constexpr int kRowBlock = 256;

// One row per block: max, sum of exp(x - max), log of the sum; the row's loss into the workspace.
template <typename T>
__global__ void __launch_bounds__(kRowBlock) ce_fwd_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                         int64_t C, float* __restrict__ row_loss,
                                                         float* __restrict__ smax, float* __restrict__ slogsum) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * C;
  float m = -INFINITY;
  for (int64_t e = threadIdx.x; e < C; e += kRowBlock) m = nan_max(m, to_f<T>(xr[e]));
  m = block_max<kRowBlock>(m, red);
  float s = 0.f;
  for (int64_t e = threadIdx.x; e < C; e += kRowBlock) s += expf(to_f<T>(xr[e]) - m);
  s = block_sum<kRowBlock>(s, red);
  if (threadIdx.x == 0) {
    const float logsum = logf(s);
    const float xt = to_f<T>(xr[clamp_target(target[row], C)]);
    row_loss[row] = logsum - (xt - m);  // -((x_t - max) - logsum), torch's log_softmax at the target
    smax[row] = m;
    slogsum[row] = logsum;
  }
}

// The mean: one block sums the rows' losses in double in a fixed order.
__global__ void __launch_bounds__(1024) ce_mean(const float* __restrict__ row_loss, int64_t N, float* __restrict__ out) {
  __shared__ double part[1024];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += 1024) acc += (double)row_loss[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = 512; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = (float)(part[0] / (double)N);
}

// grad = (exp((x - max) - logsum) - [j == target]) * g / N, from the saved (max, logsum) pair
template <typename T>
__global__ void __launch_bounds__(kRowBlock) ce_bwd_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                         int64_t N, int64_t C, const float* __restrict__ smax,
                                                         const float* __restrict__ slogsum, const float* __restrict__ grad_out,
                                                         T* __restrict__ grad) {
  const int64_t row = blockIdx.x;
  const float g = grad_out[0];
  T* gr = grad + row * C;
  if (g == 0.f) {  // nothing flows back: clear the row (16-byte stores, 8 elements each)
    if ((reinterpret_cast<uintptr_t>(gr) & 15u) == 0) {
      const int64_t nvec = C / 8;
      for (int64_t i = threadIdx.x; i < nvec; i += kRowBlock) reinterpret_cast<uint4*>(gr)[i] = make_uint4(0, 0, 0, 0);
      for (int64_t e = nvec * 8 + threadIdx.x; e < C; e += kRowBlock) gr[e] = from_f<T>(0.f);
    } else {
      for (int64_t e = threadIdx.x; e < C; e += kRowBlock) gr[e] = from_f<T>(0.f);
    }
    return;
  }
  const float scale = g / (float)N;
  const float m = smax[row], logsum = slogsum[row];
  const int64_t t = target[row];
  const T* xr = logits + row * C;
  for (int64_t e = threadIdx.x; e < C; e += kRowBlock) {
    const float p = expf((to_f<T>(xr[e]) - m) - logsum);
    gr[e] = from_f<T>((p - (e == t ? 1.f : 0.f)) * scale);
  }
}


inline size_t round256(size_t b) { return (b + 255) / 256 * 256; }
inline size_t fwd_workspace(int64_t N) { return round256(sizeof(float) * (size_t)N); }

template <typename T>
cudaError_t forward_t(const cross_entropy_args* a, cudaStream_t s) {
  const int64_t N = a->N, C = a->C;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < fwd_workspace(N)) return cudaErrorInvalidValue;
  float* row_loss = static_cast<float*>(a->workspace);
  const T* x = static_cast<const T*>(a->logits.data);
  const int64_t* t = static_cast<const int64_t*>(a->target.data);
  float* smax = static_cast<float*>(a->saved_max.data);
  float* slog = static_cast<float*>(a->saved_logsum.data);
  ce_fwd_rows<T><<<(unsigned)N, kRowBlock, 0, s>>>(x, t, C, row_loss, smax, slog);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ce_mean<<<1, 1024, 0, s>>>(row_loss, N, static_cast<float*>(a->out.data));
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const cross_entropy_bwd_args* a, cudaStream_t s) {
  ce_bwd_rows<T><<<(unsigned)a->N, kRowBlock, 0, s>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<const float*>(a->saved_max.data), static_cast<const float*>(a->saved_logsum.data),
      static_cast<const float*>(a->grad_out.data), static_cast<T*>(a->grad_logits.data));
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) { return fwd_workspace(a->N); }

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->C <= 0) return cudaSuccess;
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->C <= 0) return cudaSuccess;
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
