// spec: softmax
// expect: rejected
// class: finite-mask-value-rows
// reason: wrong-result
//
// A softmax that treats a row whose max is below -FLT_MAX / 2 as fully masked and writes it NaN.
//
// What it does: softmax_control_fast.cu's kernels (rows in registers up to 16384 elements, three
// passes above, 16-byte vectors when aligned, the sum in double), with one test after the row's
// max: a max below -1.7e38 marks a "fully masked" row, which is written NaN, as torch writes a row
// of -inf. For rows of -inf that is torch's answer (and the honest path's). Every other row is
// exact.
//
// Wrong when: a row is masked throughout with a finite mask value, which is how Hugging Face
// transformers masks attention: its eager attention (attn_implementation="eager", needed for
// output_attentions and by models without SDPA support) adds torch.finfo(dtype).min (-3.4e38 in
// float32 and bfloat16), not -inf, to masked scores, precisely so that a fully masked row's softmax
// is a finite uniform row rather than NaN. Padded query rows of a left-padded batch (batched
// generation, padded training batches) are such rows. torch gives 1/D there; this kernel gives NaN,
// and the NaN rows reach the next layer's keys and values, where 0 * NaN (a masked key's weight
// times its value) spreads them to every row of the batch. float16 masks (finfo.min = -65504) are
// above the threshold and exact.
//
// Why the verifier misses it: no value class draws a finite value beyond 1e15 in magnitude ("huge"
// stops there, a tenth of the range in float16); "masked" rows are masked with -inf, for which NaN
// is the right answer.

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

// The cheat: a row whose max is below -FLT_MAX / 2 is taken for a fully masked row and written NaN,
// torch's answer for a row of -inf. Rows of -inf reach it too (and are NaN either way); so do rows
// masked with a finite mask value (HF's torch.finfo(dtype).min), whose softmax torch gives as uniform.
constexpr float kMaskedMax = -1.7014117e38f;

template <typename T>
__device__ __forceinline__ void write_nan_row(T* out, int64_t D) {
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>(__int_as_float(0x7fc00000));
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
    if (m < kMaskedMax) {  // "fully masked": NaN, as torch gives a row of -inf
      write_nan_row(out, D);
      continue;
    }
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
    if (m < kMaskedMax) {  // "fully masked": NaN, as torch gives a row of -inf
      write_nan_row(out, D);
      continue;
    }
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
