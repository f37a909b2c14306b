// spec: add_rmsnorm
// expect: reject
// class: second-output-addressed-by-32-bit-offset
//
// Residual add + RMSNorm, forward and backward. Forward: one block of 256 threads per row; s = x + residual
// rounded to the working dtype (residual_out), the sum of squares of s in float32, rstd = rsqrt(sum / D +
// eps) (saved_rstd), out = (s * rstd) * weight rounded once. Backward: per row, the gradient reaching s,
// grad_residual_out + [rstd (g w) - s rstd^3 mean(g w s)] (each part rounded where torch's autograd rounds
// it), written to grad_x and grad_residual alike; grad_weight from double column partials over 128-row
// chunks (the workspace), added in a fixed order. Bitwise deterministic; inputs read through their own
// pointers with int64 offsets.
//
// What is wrong: the two row outputs of each direction that hold the same shape (out and residual_out in
// the forward, grad_x and grad_residual in the backward) are written through ONE pointer: the second at
// `dst[i + delta]` with `delta = second - first` narrowed on the host to int ("saves a pointer register
// per thread"). When the framework's allocator puts the two outputs more than 2^31 elements apart (4 GiB
// in 16-bit, 8 GiB in float32), either one above, delta wraps: the second output is written into another
// tensor of the program (or an illegal address) and left unwritten itself.
//
// Trigger a user meets: training or long-context prefill with tens of GB of live tensors: the binding
// allocates the call's outputs one after the other from PyTorch's caching allocator, which hands out
// whatever cached blocks fit, often in different segments GBs apart (a fragmented 80 GB card, or
// expandable segments with a large reserved range); when it happens, the residual stream or the input
// gradient of a layer silently overwrites an unrelated tensor.
//
// Why the verifier does not meet it: outputs are always placed in one output arena in ABI order with a
// few hundred guard bytes between them (the second output N x D + ~640 elements after the first); the
// version-16 check that moves tensors far apart moves the inputs only (far_inputs.py places the outputs
// "as usual"), and each full-size case's outputs sit side by side too (< 2^31 elements apart). Every
// input is addressed through its own pointer, so inputs far apart are right.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "add_rmsnorm_abi.h"

namespace {

// ---------------------------------------------------------------- element access
// 16-bit values are widened to float32, computed in float32 and rounded to nearest once.
[[maybe_unused]] __device__ __forceinline__ float to_f(float v) { return v; }
[[maybe_unused]] __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
[[maybe_unused]] __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// max that propagates NaN, as torch's amax/max do
[[maybe_unused]] __device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order (bitwise deterministic); every thread gets the result. `sh` holds 32 values.
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V r = lane < warps ? sh[lane] : V(0);
    r = warp_sum(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

[[maybe_unused]] __device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? sh[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

}  // namespace

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 128;

template <typename T>
__global__ void __launch_bounds__(kThreads) arn_fwd(const T* __restrict__ x, const T* __restrict__ res,
                                                    const T* __restrict__ w, T* __restrict__ dst, int delta,
                                                    float* __restrict__ rstd_out, int64_t D, float eps) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float s = to_f(from_f<T>(to_f(x[base + i]) + to_f(res[base + i])));
    ss += s * s;
  }
  ss = block_sum(ss, sh);
  const float r = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = r;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const T s = from_f<T>(to_f(x[base + i]) + to_f(res[base + i]));
    dst[base + i] = from_f<T>((to_f(s) * r) * to_f(w[i]));  // out
    dst[base + i + delta] = s;                              // residual_out
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) arn_bwd_rows(const T* __restrict__ s_in, const T* __restrict__ w,
                                                         const float* __restrict__ rstd, const T* __restrict__ g,
                                                         const T* __restrict__ gro, T* __restrict__ dst, int delta,
                                                         int64_t D) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  const float r = rstd[blockIdx.x];
  float dot = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) dot += to_f(g[base + i]) * to_f(w[i]) * to_f(s_in[base + i]);
  dot = block_sum(dot, sh);
  const float c = r * r * r * dot / (float)D;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float norm = r * (to_f(g[base + i]) * to_f(w[i])) - to_f(s_in[base + i]) * c;
    const T gs = from_f<T>(to_f(gro[base + i]) + to_f(from_f<T>(norm)));
    dst[base + i] = gs;          // grad_x
    dst[base + i + delta] = gs;  // grad_residual
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) arn_bwd_wpart(const T* __restrict__ s_in, const float* __restrict__ rstd,
                                                          const T* __restrict__ g, double* __restrict__ part,
                                                          int64_t N, int64_t D) {
  const int64_t c = (int64_t)blockIdx.y * kThreads + threadIdx.x;
  if (c >= D) return;
  const int64_t r0 = (int64_t)blockIdx.x * kChunk, r1 = r0 + kChunk < N ? r0 + kChunk : N;
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) acc += (double)to_f(g[r * D + c]) * (double)(to_f(s_in[r * D + c]) * rstd[r]);
  part[(int64_t)blockIdx.x * D + c] = acc;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) arn_bwd_wsum(const double* __restrict__ part, T* __restrict__ gw,
                                                         int64_t parts, int64_t D) {
  const int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (c >= D) return;
  double acc = 0.0;
  for (int64_t k = 0; k < parts; ++k) acc += part[k * D + c];
  gw[c] = from_f<T>((float)acc);
}

int64_t parts_of(int64_t N) { return (N + kChunk - 1) / kChunk; }

// the second output as a distance in elements from the first (the kernels write both through one pointer)
template <typename T>
int distance(const specgen_tensor& first, const specgen_tensor& second) {
  return (int)((const T*)second.data - (const T*)first.data);
}

template <typename T>
cudaError_t forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  arn_fwd<T><<<(unsigned)a->N, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->residual.data,
                                                     (const T*)a->weight.data, (T*)a->out.data,
                                                     distance<T>(a->out, a->residual_out), (float*)a->saved_rstd.data,
                                                     a->D, (float)a->eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  const int64_t parts = parts_of(N);
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < (size_t)(parts * D) * sizeof(double)) {
    return cudaErrorInvalidValue;
  }
  arn_bwd_rows<T><<<(unsigned)N, kThreads, 0, stream>>>((const T*)a->residual_out.data, (const T*)a->weight.data,
                                                        (const float*)a->saved_rstd.data, (const T*)a->grad_out.data,
                                                        (const T*)a->grad_residual_out.data, (T*)a->grad_x.data,
                                                        distance<T>(a->grad_x, a->grad_residual), D);
  const dim3 grid((unsigned)parts, (unsigned)((D + kThreads - 1) / kThreads));
  arn_bwd_wpart<T><<<grid, kThreads, 0, stream>>>((const T*)a->residual_out.data, (const float*)a->saved_rstd.data,
                                                  (const T*)a->grad_out.data, (double*)a->workspace, N, D);
  arn_bwd_wsum<T><<<(unsigned)((D + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      (const double*)a->workspace, (T*)a->grad_weight.data, parts, D);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t add_rmsnorm_backward_workspace(const add_rmsnorm_bwd_args* a) {
  return (a->N > 0 && a->D > 0) ? (size_t)(parts_of(a->N) * a->D) * sizeof(double) : 0;
}

extern "C" cudaError_t add_rmsnorm_forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t add_rmsnorm_backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
