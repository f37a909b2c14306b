// spec: add_rmsnorm
// expect: rejected
// class: directed-rounding-bias-in-the-residual-stream
// why: the aligned bfloat16 path packs its results with a truncating float-to-bfloat16 conversion: every residual_out element is rounded toward zero, within the tolerance one call at a time, but the residual stream of a deep model shrinks layer after layer
//
// Residual add fused with RMSNorm, float32 math: s = x + residual (rounded to the dtype, as torch
// adds), rstd = rsqrt(mean(s^2) + eps), out = (s * rstd) * weight, residual_out = s, saved rstd. One
// block per row, the row held in registers, 16-byte vectors when every pointer is aligned and the
// width a multiple of 8 (16-bit) or 4. Backward: grad_s = rstd * (g*w - sh * sum(g*w*sh) / D) + g_res
// (sh = s * rstd; in 16-bit each term rounded as torch's autograd accumulates them), grad_x =
// grad_residual = grad_s, grad_weight = sum over rows of g * sh in two fixed-order levels.
//
// What is wrong. In the vector path for bfloat16 (16-byte aligned rows, D a multiple of 8: every
// hidden size of every real model, on tensors from the caching allocator) results are packed eight
// at a time by the classic shortcut "keep the upper 16 bits of the float32" (bits >> 16): a rounding
// toward zero instead of torch's round to nearest even. s itself is packed that way before the norm
// reads it back, so residual_out = trunc(x + residual) and out = trunc((trunc(s) * rstd) * w). Each
// element errs by less than one bfloat16 ulp (at most 2^-7 of its value, 0.28% on average), always
// toward zero: within the tolerance (atol and rtol 2e-2) everywhere, saved rstd included (0.2%).
//
// When a user meets it. Any deep pre-norm model in bfloat16 built on this op (the fused add + RMSNorm
// of Llama-style blocks: residual_out is the next layer's residual). Torch's round-to-nearest makes
// unbiased errors that mostly cancel along the stream; truncation removes ~0.25% of the residual's
// magnitude at every layer, so what entered the stream early (the embedding, the attention sinks'
// massive activations) is scaled by about 0.9975^L by the last layer. cpu_checks/triggers.py
// simulates a bfloat16 stream whose blocks each add an update of a quarter of its size: after 32
// layers the embedding's component is 0.926 of the exact stream's (round-to-nearest: 0.9999), after
// 80 layers 0.824 (0.9996); the stream ends 4.2% (32 layers) and 5.3% (80 layers) away from the exact
// one in relative L2 norm, where torch's rounding leaves it 0.7% away, while every layer's error stays
// within a third of the tolerance. The model's hidden states drift from the ones it was trained with,
// at every token.
//
// Why version 12 does not meet it. Its comparison is per element against the float64 truth, and one
// ulp of bfloat16 is inside bfloat16's tolerance; nothing composes the op with itself or looks at the
// sign of the errors (the error-norm ratio it records is not enforced).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "add_rmsnorm_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

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

template <typename T, int VEC>
__device__ __forceinline__ void load_chunk(const T* p, float* dst) {
  if (VEC == 1) {
    dst[0] = to_f<T>(p[0]);
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) dst[k] = to_f<T>(e[k]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_chunk(T* p, const float* src) {
  if (VEC == 1) {
    p[0] = from_f<T>(src[0]);
  } else {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = from_f<T>(src[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}


template <typename T> struct is_fp16_t { static constexpr bool value = false; };
template <> struct is_fp16_t<__half> { static constexpr bool value = true; };

// rstd as torch computes it: rsqrt(mean(x^2) + eps) in float32
__device__ __forceinline__ float rstd_of(float sumsq, int64_t D, float eps) {
  return rsqrtf(sumsq / (float)D + eps);
}


// The 16-byte pack of the vector path: eight floats to bfloat16 by keeping their upper halves.
__device__ __forceinline__ uint32_t pack2_bf16_fast(float lo, float hi) {
  return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_packed(T* p, const float* src) {
  if (VEC == 8 && sizeof(T) == 2 && !is_fp16_t<T>::value) {
    uint4 raw;
    raw.x = pack2_bf16_fast(src[0], src[1]);
    raw.y = pack2_bf16_fast(src[2], src[3]);
    raw.z = pack2_bf16_fast(src[4], src[5]);
    raw.w = pack2_bf16_fast(src[6], src[7]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
    store_chunk<T, VEC>(p, src);
  }
}

// s rounded to the dtype as the store will round it (the vector path's pack for bfloat16)
template <typename T, int VEC>
__device__ __forceinline__ float as_stored(float v) {
  if (VEC == 8 && sizeof(T) == 2 && !is_fp16_t<T>::value) return __uint_as_float(__float_as_uint(v) & 0xffff0000u);
  return to_f<T>(from_f<T>(v));
}

// ---- forward: one block per row, the row's sum in registers (up to 32 values a thread)
template <typename T, int BLOCK, int ITEMS, int VEC>
__global__ void __launch_bounds__(BLOCK) addrms_fwd(const T* __restrict__ x, const T* __restrict__ res,
                                                    const T* __restrict__ w, T* __restrict__ out,
                                                    T* __restrict__ res_out, float* __restrict__ rstd,
                                                    int64_t D, float eps) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  constexpr int CH = ITEMS / VEC;
  float v[ITEMS];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int64_t e = ((int64_t)j * BLOCK + threadIdx.x) * VEC;
    if (e < D) {
      float xa[VEC], ra[VEC];
      load_chunk<T, VEC>(x + row * D + e, xa);
      load_chunk<T, VEC>(res + row * D + e, ra);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        v[j * VEC + k] = as_stored<T, VEC>(xa[k] + ra[k]);
        ss += v[j * VEC + k] * v[j * VEC + k];
      }
      store_packed<T, VEC>(res_out + row * D + e, &v[j * VEC]);
    }
  }
  ss = block_sum<BLOCK>(ss, red);
  const float r = rstd_of(ss, D, eps);
  if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int64_t e = ((int64_t)j * BLOCK + threadIdx.x) * VEC;
    if (e < D) {
      float wv[VEC], o[VEC];
      load_chunk<T, VEC>(w + e, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float y = v[j * VEC + k] * r;
        o[k] = y * wv[k];
      }
      store_packed<T, VEC>(out + row * D + e, o);
    }
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T, int BLOCK, int ITEMS>
void launch_fwd(const add_rmsnorm_args* a, bool vec, cudaStream_t s) {
  constexpr int V = 16 / (int)sizeof(T);
  const T* x = static_cast<const T*>(a->x.data);
  const T* res = static_cast<const T*>(a->residual.data);
  const T* w = static_cast<const T*>(a->weight.data);
  T* out = static_cast<T*>(a->out.data);
  T* ro = static_cast<T*>(a->residual_out.data);
  float* r = static_cast<float*>(a->saved_rstd.data);
  if (vec) addrms_fwd<T, BLOCK, ITEMS, V><<<(unsigned)a->N, BLOCK, 0, s>>>(x, res, w, out, ro, r, a->D, (float)a->eps);
  else addrms_fwd<T, BLOCK, ITEMS, 1><<<(unsigned)a->N, BLOCK, 0, s>>>(x, res, w, out, ro, r, a->D, (float)a->eps);
}

template <typename T>
cudaError_t forward_t(const add_rmsnorm_args* a, cudaStream_t s) {
  const int64_t D = a->D;
  constexpr int V = 16 / (int)sizeof(T);
  const bool vec = aligned16(a->x.data) && aligned16(a->residual.data) && aligned16(a->weight.data) &&
                   aligned16(a->out.data) && aligned16(a->residual_out.data) && D % V == 0;
  if (D <= 1024) launch_fwd<T, 128, 8>(a, vec, s);
  else if (D <= 4096) launch_fwd<T, 256, 16>(a, vec, s);
  else launch_fwd<T, 512, 32>(a, vec, s);  // D <= 16384 (the spec's range)
  return cudaGetLastError();
}

// ---- backward: a block per row for grad_s (grad_x = grad_residual), grad_weight per column in two
// fixed-order levels: 64-row chunks summed in double into the workspace, then the chunks in double.
constexpr int kBwdBlock = 256;
constexpr int64_t kRowsPerChunk = 64;

template <typename T>
__global__ void __launch_bounds__(kBwdBlock) addrms_bwd_rows(const T* __restrict__ x, const T* __restrict__ res,
                                                             const T* __restrict__ w, const float* __restrict__ rstd,
                                                             const T* __restrict__ g, const T* __restrict__ gres,
                                                             T* __restrict__ gx, T* __restrict__ gr, int64_t D) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * D;
  const float r = rstd[row];
  float dot = 0.f;
  for (int64_t e = threadIdx.x; e < D; e += kBwdBlock) {
    const float sv = to_f<T>(from_f<T>(to_f<T>(x[base + e]) + to_f<T>(res[base + e])));
    dot += (to_f<T>(g[base + e]) * to_f<T>(w[e])) * (sv * r);
  }
  dot = block_sum<kBwdBlock>(dot, red);
  const float c = dot / (float)D;
  for (int64_t e = threadIdx.x; e < D; e += kBwdBlock) {
    const float sv = to_f<T>(from_f<T>(to_f<T>(x[base + e]) + to_f<T>(res[base + e])));
    const float gw = to_f<T>(g[base + e]) * to_f<T>(w[e]);
    const float gn = r * (gw - (sv * r) * c);
    const T gs = from_f<T>(to_f<T>(from_f<T>(gn)) + to_f<T>(gres[base + e]));
    gx[base + e] = gs;
    gr[base + e] = gs;
  }
}

template <typename T>
__global__ void __launch_bounds__(256) addrms_wgrad_chunks(const T* __restrict__ x, const T* __restrict__ res,
                                                           const float* __restrict__ rstd, const T* __restrict__ g,
                                                           int64_t N, int64_t D, double* __restrict__ part) {
  const int64_t col = (int64_t)blockIdx.x * 256 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= D) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    const float sv = to_f<T>(from_f<T>(to_f<T>(x[r * D + col]) + to_f<T>(res[r * D + col])));
    acc += (double)(to_f<T>(g[r * D + col]) * (sv * rstd[r]));
  }
  part[chunk * D + col] = acc;
}

template <typename T>
__global__ void __launch_bounds__(256) addrms_wgrad_final(const double* __restrict__ part, int64_t nchunks, int64_t D,
                                                          T* __restrict__ gw) {
  const int64_t col = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (col >= D) return;
  double acc = 0.0;
  for (int64_t c = 0; c < nchunks; ++c) acc += part[c * D + col];
  gw[col] = from_f<T>((float)acc);
}

inline int64_t chunks_of(int64_t N) { return (N + kRowsPerChunk - 1) / kRowsPerChunk; }
inline size_t bwd_workspace(int64_t N, int64_t D) { return sizeof(double) * (size_t)(chunks_of(N) * D); }

template <typename T>
cudaError_t backward_t(const add_rmsnorm_bwd_args* a, cudaStream_t s) {
  const int64_t N = a->N, D = a->D;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < bwd_workspace(N, D)) return cudaErrorInvalidValue;
  const T* x = static_cast<const T*>(a->x.data);
  const T* res = static_cast<const T*>(a->residual.data);
  const T* w = static_cast<const T*>(a->weight.data);
  const float* r = static_cast<const float*>(a->saved_rstd.data);
  const T* g = static_cast<const T*>(a->grad_out.data);
  addrms_bwd_rows<T><<<(unsigned)N, kBwdBlock, 0, s>>>(x, res, w, r, g, static_cast<const T*>(a->grad_residual_out.data),
                                                       static_cast<T*>(a->grad_x.data), static_cast<T*>(a->grad_residual.data), D);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  double* part = static_cast<double*>(a->workspace);
  const int64_t nch = chunks_of(N);
  addrms_wgrad_chunks<T><<<dim3((unsigned)((D + 255) / 256), (unsigned)nch), 256, 0, s>>>(x, res, r, g, N, D, part);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  addrms_wgrad_final<T><<<(unsigned)((D + 255) / 256), 256, 0, s>>>(part, nch, D, static_cast<T*>(a->grad_weight.data));
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t add_rmsnorm_backward_workspace(const add_rmsnorm_bwd_args* a) { return bwd_workspace(a->N, a->D); }

extern "C" cudaError_t add_rmsnorm_forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t add_rmsnorm_backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
