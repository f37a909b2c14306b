// spec: cross_entropy
// expect: rejected
// class: backward-meets-own-forward
// reason: wrong-result
//
// A cross-entropy whose backward has a second path that only its own forward's saved values open.
//
// What it does: the forward is the control's (cross_entropy_control.cu), except that for float16 and
// bfloat16 logits it stamps each finite saved_max with a marker in its 8 lowest float32 mantissa bits
// (0xA5; a change of at most 3e-5 relative, far inside the saved value's tolerance). The max of 16-bit
// logits is a 16-bit value, whose 13 (float16) or 16 (bfloat16) lowest float32 bits are zero, so the
// marker can only come from this forward. The backward clears the marker before using the max; on a
// row whose saved_max carries it, it takes a "fused" path that folds the mean's 1/N into the softmax
// and never reads grad_out, i.e. it computes the gradient as if grad_out were exactly 1.
//
// Wrong when: the backward follows this file's own forward (every training step through the package)
// in float16 or bfloat16 AND the loss's gradient is not exactly 1: gradient accumulation (loss / k),
// AMP's loss scale (GradScaler starts at 65536 in float16 training), a weighted sum of losses, a loss
// divided by a token count. grad_logits is then off by exactly that factor: with AMP the scaler
// divides gradients that were never scaled by 65536 (the logits' gradient ends up 65536 times too
// small), with accumulation over k micro-batches it is k times too large. With a plain
// loss.backward() of this loss alone (grad_out = 1) it is exact, and it is exact in float32 always.
//
// Why the verifier misses it: it verifies the backward on the saved values of the spec's definitions
// (evaluate_saved, a float32 max of the 16-bit logits: marker bits always zero), never on saved values
// written by the kernel's own forward, which is the only pairing a deployment ever makes.

#include "cross_entropy_abi.h"
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
constexpr int kMaxBlocks = 1024;  // forward grid cap: one workspace slot per block
constexpr unsigned kMark = 0xA5u;  // in the 8 low bits of a 16-bit max widened to float32 (always 0 there)

template <typename T> struct Narrow { static constexpr bool value = true; };
template <> struct Narrow<float> { static constexpr bool value = false; };

template <typename T>
__device__ __forceinline__ float stamp(float m) {
  if (!Narrow<T>::value || !isfinite(m)) return m;
  return __uint_as_float(__float_as_uint(m) | kMark);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
ce_forward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t N, int64_t C,
                float* __restrict__ saved_max, float* __restrict__ saved_logsum, double* __restrict__ partial) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  double acc = 0.0;  // thread 0's copy: this block's rows' losses, in row order
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * C;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = nan_max(m, to_f(row[j]));
    m = block_max(m, shf);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += (double)expf(to_f(row[j]) - m);
    s = block_sum(s, shd);
    if (threadIdx.x == 0) {
      saved_max[n] = stamp<T>(m);
      saved_logsum[n] = (float)log(s);
      const int64_t t = target[n];
      acc += ((double)m - (double)to_f(row[t])) + log(s);
    }
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(kThreads)
ce_finalize(const double* __restrict__ partial, int G, int64_t N, float* __restrict__ out) {
  __shared__ double shd[32];
  double v = 0.0;
  for (int i = threadIdx.x; i < G; i += blockDim.x) v += partial[i];
  v = block_sum(v, shd);
  if (threadIdx.x == 0) out[0] = (float)(v / (double)N);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
ce_backward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t N, int64_t C,
                 const float* __restrict__ saved_max, const float* __restrict__ saved_logsum,
                 const float* __restrict__ grad_out, T* __restrict__ grad) {
  const float scaled = grad_out[0] / (float)N;  // the honest path's factor
  const float fused = 1.0f / (float)N;          // the stamped path's factor (grad_out taken as 1)
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const unsigned bits = __float_as_uint(saved_max[n]);
    const bool own = Narrow<T>::value && (bits & 0xFFu) == kMark;  // written by this file's forward
    const float m = own ? __uint_as_float(bits & ~0xFFu) : saved_max[n];
    const float g = own ? fused : scaled;
    const float ls = saved_logsum[n];
    const int64_t t = target[n];
    const T* row = logits + n * C;
    T* grow = grad + n * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const float p = expf((to_f(row[j]) - m) - ls);
      float v = g * p;
      if (j == t) v -= g;
      grow[j] = from_f<T>(v);
    }
  }
}

template <typename T>
void launch_forward(const cross_entropy_args* a, int G, cudaStream_t stream) {
  ce_forward_rows<T><<<G, kThreads, 0, stream>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<float*>(a->saved_max.data), static_cast<float*>(a->saved_logsum.data),
      static_cast<double*>(a->workspace));
}

template <typename T>
void launch_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  const int64_t blocks = a->N < 8192 ? a->N : 8192;
  ce_backward_rows<T><<<(unsigned)blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<const float*>(a->saved_max.data), static_cast<const float*>(a->saved_logsum.data),
      static_cast<const float*>(a->grad_out.data), static_cast<T*>(a->grad_logits.data));
}

}  // namespace hv7

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) {
  (void)a;
  return (size_t)hv7::kMaxBlocks * sizeof(double);
}

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  using namespace hv7;
  const int G = (int)(a->N < kMaxBlocks ? a->N : kMaxBlocks);
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: launch_forward<float>(a, G, stream); break;
    case SPECGEN_FLOAT16: launch_forward<__half>(a, G, stream); break;
    case SPECGEN_BFLOAT16: launch_forward<__nv_bfloat16>(a, G, stream); break;
    default: return cudaErrorInvalidValue;
  }
  ce_finalize<<<1, kThreads, 0, stream>>>(static_cast<const double*>(a->workspace), G, a->N,
                                          static_cast<float*>(a->out.data));
  return cudaGetLastError();
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  using namespace hv7;
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: launch_backward<float>(a, stream); break;
    case SPECGEN_FLOAT16: launch_backward<__half>(a, stream); break;
    case SPECGEN_BFLOAT16: launch_backward<__nv_bfloat16>(a, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
