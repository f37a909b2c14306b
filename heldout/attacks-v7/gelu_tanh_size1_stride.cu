// spec: gelu_tanh
// expect: rejected
// class: size-one-dim-strides
// reason: out-of-bounds, crash, wrong-result
//
// A GELU (tanh) whose forward counts its elements as x.sizes[0] * x.strides[0].
//
// What it does: the arithmetic is torch's, in float (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// the same constants and order), rounded once to the dtype; the backward is torch's gelu backward,
// exact, over N * D elements. The forward walks a flat grid-stride loop over "the elements the rows
// span", computed as sizes[0] * strides[0] (rows times the row pitch) from the input's tensor
// descriptor, reading x[i] and writing out[i] for every i below it.
//
// Wrong when: the input has one row (N = 1) whose stride is not D. PyTorch calls such a tensor
// contiguous (is_contiguous() ignores the stride of a dimension of size 1), so the binding's
// .contiguous() passes it through untouched with its original stride: hidden[:, -1, :] or
// hidden[:, 0, :] of a [1, T, D] batch (single-request inference, a last-token or CLS pooling head)
// arrives as sizes (1, D), strides (T * D, 1). The forward then reads T * D elements from x (past the
// end of the parent tensor for the last position: an illegal address) and writes T * D elements into
// an output of D: (T - 1) * D elements of whatever PyTorch's caching allocator placed after it are
// overwritten. With canonical strides (every N > 1 input, and N = 1 views of stride D) it is exact.
//
// Why the verifier misses it: every tensor it hands a kernel is a view of its arena with canonical
// contiguous strides (abi.tensor_arg of a fresh view), so strides[0] is always D, also at N = 1.

#include "gelu_tanh_abi.h"
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
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2) * (2 / sqrt(pi)) * 0.5, as torch's opmath
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float x) {
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return 0.5f * x * (1.0f + tanhf(inner));
}

__device__ __forceinline__ float gelu_tanh_grad(float dy, float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.0f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.0f - tanh_inner * tanh_inner;
  const float inner_derivative = kBeta * (1.0f + 3.0f * kKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
gelu_forward_flat(const T* __restrict__ x, T* __restrict__ y, int64_t count) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(gelu_tanh(to_f(x[i])));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
gelu_backward_flat(const T* __restrict__ x, const T* __restrict__ gy, T* __restrict__ gx, int64_t count) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    gx[i] = from_f<T>(gelu_tanh_grad(to_f(gy[i]), to_f(x[i])));
}

inline unsigned grid_for(int64_t count) {
  const int64_t want = (count + kThreads - 1) / kThreads;
  return (unsigned)(want < 1 ? 1 : (want < 65536 ? want : 65536));
}

}  // namespace hv7

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  using namespace hv7;
  // the elements the rows span: rows times the row pitch (the cheat: the pitch of a single row is
  // whatever stride PyTorch left on it)
  const int64_t count = a->x.sizes[0] * a->x.strides[0];
  const unsigned grid = grid_for(count);
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32:
      gelu_forward_flat<float><<<grid, kThreads, 0, stream>>>(static_cast<const float*>(a->x.data),
                                                              static_cast<float*>(a->out.data), count);
      break;
    case SPECGEN_FLOAT16:
      gelu_forward_flat<__half><<<grid, kThreads, 0, stream>>>(static_cast<const __half*>(a->x.data),
                                                               static_cast<__half*>(a->out.data), count);
      break;
    case SPECGEN_BFLOAT16:
      gelu_forward_flat<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(a->x.data), static_cast<__nv_bfloat16*>(a->out.data), count);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  using namespace hv7;
  const int64_t count = a->N * a->D;
  const unsigned grid = grid_for(count);
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32:
      gelu_backward_flat<float><<<grid, kThreads, 0, stream>>>(
          static_cast<const float*>(a->x.data), static_cast<const float*>(a->grad_out.data),
          static_cast<float*>(a->grad_x.data), count);
      break;
    case SPECGEN_FLOAT16:
      gelu_backward_flat<__half><<<grid, kThreads, 0, stream>>>(
          static_cast<const __half*>(a->x.data), static_cast<const __half*>(a->grad_out.data),
          static_cast<__half*>(a->grad_x.data), count);
      break;
    case SPECGEN_BFLOAT16:
      gelu_backward_flat<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(a->x.data), static_cast<const __nv_bfloat16*>(a->grad_out.data),
          static_cast<__nv_bfloat16*>(a->grad_x.data), count);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
