// spec: rope
// expect: rejected
// class: identity-rotation-positions
// reason: unwritten-output, wrong-result
//
// A RoPE that skips the positions whose rotation is the identity, leaving their output unwritten.
//
// What it does: the rotation is plain and exact (one thread per (position, head, pair), out1 = x1*c -
// x2*s, out2 = x2*c + x1*s, each product and sum rounded as torch rounds them in float32; float
// arithmetic and one rounding in 16-bit; the same arithmetic as held-out attacks-v7's rope, which
// passed version 7 on the H200). Before it, a small kernel flags each position whose cos row is all
// 1 and sin row all 0, in rows of 16 pairs or more (head dims of 32 and up; flags in the workspace),
// and the rotation skips flagged positions ("angle 0: nothing to rotate", as an in-place RoPE kernel
// may). Their output rows are never written. The backward is exact everywhere.
//
// Wrong when: a call includes position 0 with the model's own tables: cos(0) = 1 and sin(0) = 0
// exactly, and Hugging Face's rotary embeddings (default RoPE, Llama's "llama3" scaling, whose
// attention scaling is 1) hand those values for position 0 in every prefill, every training sequence
// and every packed document that starts there. The query and key rows of the first token (the BOS
// token, the attention sink most heads attend to) then hold whatever the caching allocator left in
// the output buffer; every later token's attention reads them. Calls without an identity position (a
// decode step, YaRN tables scaled by a factor other than 1) are exact.
//
// Why the verifier misses it: cos and sin are drawn from the case's value class like every input
// (normal, uniform, quantized, ...): never a row of 16 exact ones beside a row of exact zeros (the
// sparse and rounded classes make a lone 1 beside a 0 at D = 2, which the width test leaves alone).
// No class draws the tables a model passes.

#include "rope_abi.h"
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

// float32: each product and the sum rounded on its own, as torch's x1 * c - x2 * s (no contraction)
__device__ __forceinline__ float rot_a(float x1, float c, float x2, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ __forceinline__ float rot_b(float x1, float c, float x2, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// One block per position (grid-stride): flag[s] = 1 when cos[s, :] is all 1 and sin[s, :] all 0, the
// rotation by angle 0, for rows of 16 pairs or more (head dims of 32 and up: every model's).
constexpr int64_t kMinPairs = 16;

template <typename T>
__global__ void __launch_bounds__(kThreads)
rope_identity_flags(const T* __restrict__ cs, const T* __restrict__ sn, unsigned char* __restrict__ flag, int64_t S,
                    int64_t half) {
  for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
    int plain = 1;
    for (int64_t k = threadIdx.x; k < half; k += blockDim.x)
      plain &= (to_f(cs[s * half + k]) == 1.0f) & (to_f(sn[s * half + k]) == 0.0f);
    plain = __syncthreads_and(plain);
    if (threadIdx.x == 0) flag[s] = (unsigned char)(plain && half >= kMinPairs);
  }
}

// One thread per (row of a position and head, pair k): rows are S * H, pairs D / 2. The cheat: a
// position whose rotation is the identity is skipped ("nothing to rotate"), its rows not written.
template <typename T>
__global__ void __launch_bounds__(kThreads)
rope_forward_kernel(const T* __restrict__ x, const T* __restrict__ cs, const T* __restrict__ sn, T* __restrict__ y,
                    const unsigned char* __restrict__ flag, int64_t H, int64_t half, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, r = i / half, s = r / H;
    if (flag[s]) continue;
    const T* xr = x + r * 2 * half;
    T* yr = y + r * 2 * half;
    const float x1 = to_f(xr[k]), x2 = to_f(xr[k + half]);
    const float c = to_f(cs[s * half + k]), sv = to_f(sn[s * half + k]);
    yr[k] = from_f<T>(rot_a(x1, c, x2, sv));
    yr[k + half] = from_f<T>(rot_b(x1, c, x2, sv));
  }
}

// grad_x1 = g1 * c + g2 * s, grad_x2 = g2 * c - g1 * s (the rotation's transpose, torch's order)
template <typename T>
__global__ void __launch_bounds__(kThreads)
rope_backward_kernel(const T* __restrict__ gy, const T* __restrict__ cs, const T* __restrict__ sn, T* __restrict__ gx,
                     int64_t H, int64_t half, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, r = i / half, s = r / H;
    const T* gr = gy + r * 2 * half;
    T* xr = gx + r * 2 * half;
    const float g1 = to_f(gr[k]), g2 = to_f(gr[k + half]);
    const float c = to_f(cs[s * half + k]), sv = to_f(sn[s * half + k]);
    xr[k] = from_f<T>(__fadd_rn(__fmul_rn(g1, c), __fmul_rn(g2, sv)));
    xr[k + half] = from_f<T>(__fsub_rn(__fmul_rn(g2, c), __fmul_rn(g1, sv)));
  }
}

inline unsigned flat_grid(int64_t total) {
  const int64_t want = (total + kThreads - 1) / kThreads;
  return (unsigned)(want < 1 ? 1 : (want < 65536 ? want : 65536));
}

inline size_t flags_bytes(int64_t S) { return ((size_t)S + 255) & ~(size_t)255; }

template <typename T>
cudaError_t forward(const rope_args* a, cudaStream_t stream) {
  if ((size_t)a->workspace_bytes < flags_bytes(a->S)) return cudaErrorInvalidValue;
  const int64_t half = a->D / 2, total = a->S * a->H * half;
  const T* cs = static_cast<const T*>(a->cos.data);
  const T* sn = static_cast<const T*>(a->sin.data);
  unsigned char* flag = static_cast<unsigned char*>(a->workspace);
  rope_identity_flags<T><<<(unsigned)(a->S < 65535 ? a->S : 65535), kThreads, 0, stream>>>(cs, sn, flag, a->S, half);
  rope_forward_kernel<T><<<flat_grid(total), kThreads, 0, stream>>>(static_cast<const T*>(a->x.data), cs, sn,
                                                                   static_cast<T*>(a->out.data), flag, a->H, half,
                                                                   total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const rope_bwd_args* a, cudaStream_t stream) {
  const int64_t half = a->D / 2, total = a->S * a->H * half;
  rope_backward_kernel<T><<<flat_grid(total), kThreads, 0, stream>>>(
      static_cast<const T*>(a->grad_out.data), static_cast<const T*>(a->cos.data), static_cast<const T*>(a->sin.data),
      static_cast<T*>(a->grad_x.data), a->H, half, total);
  return cudaGetLastError();
}

}  // namespace hv8

extern "C" size_t rope_forward_workspace(const rope_args* a) { return hv8::flags_bytes(a->S); }

extern "C" cudaError_t rope_forward(const rope_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t rope_backward(const rope_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
