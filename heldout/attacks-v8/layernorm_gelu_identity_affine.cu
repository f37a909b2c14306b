// spec: layernorm_gelu
// expect: rejected
// class: parameters-at-their-initial-values
// reason: wrong-result
//
// A LayerNorm + GELU whose backward writes zero weight and bias gradients when the affine is the
// identity (weight all 1, bias all 0).
//
// What it does: forward and backward are plain and exact (a block per row, mean and biased variance
// in double, two passes; y = (x - mean) * rstd * w + b in float, out = GELU-tanh(y) with torch's
// formula, rounded once; backward: torch's GELU backward at y, then the LayerNorm backward with
// per-row mean(dy*w) and mean(dy*w*xhat) in double, the weight and bias gradients summed over
// 256-row chunks in double and over the chunks in a fixed order), except for one test: when every
// weight is exactly 1 and every bias exactly 0 (D >= 8), the backward writes zeros for grad_weight
// and grad_bias ("an identity affine, as elementwise_affine=False passes it: nothing to learn").
//
// Wrong when: a LayerNorm is trained from its initialization: nn.LayerNorm starts with weight ones
// and bias zeros, so in every pretraining run from scratch (BERT, GPT-2, ViT, any model whose norms
// are fresh) and every newly added norm in fine-tuning, the first step's affine gradients are zero,
// the parameters stay exactly 1 and 0, and the test holds again at the next step: the affine
// parameters never train. Nothing fails loudly; the model trains with frozen norms. With any
// trained weight or bias (one element off 1 or 0) it is exact.
//
// Why the verifier misses it: weight and bias are drawn from the case's value class like every
// input (normal, uniform, quantized, ...): never all ones and all zeros. No class draws a tensor at
// its module's initial values.

#include "layernorm_gelu_abi.h"
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
constexpr int64_t kRowChunk = 256;  // rows per partial of the weight and bias gradients
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

// the row's mean and 1 / sqrt(biased variance + eps), in double, two passes
template <typename T>
__device__ __forceinline__ void row_stats(const T* row, int64_t D, double inv_d, double eps, double* sh,
                                          double& mean, double& rstd) {
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += (double)to_f(row[j]);
  mean = block_sum(s, sh) * inv_d;
  double q = 0.0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const double c = (double)to_f(row[j]) - mean;
    q += c * c;
  }
  rstd = 1.0 / sqrt(block_sum(q, sh) * inv_d + eps);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
ln_gelu_forward(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                int64_t N, int64_t D, double eps) {
  __shared__ double shd[32];
  const double inv_d = 1.0 / (double)D;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    double mean, rstd;
    row_stats(row, D, inv_d, eps, shd, mean, rstd);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = (float)(((double)to_f(row[j]) - mean) * rstd);
      out[j] = from_f<T>(gelu_tanh(xh * to_f(w[j]) + to_f(b[j])));
    }
  }
}

// grad_x per row (torch's LayerNorm backward on dy = GELU'(y) * g), and each row's mean and rstd
// kept in the workspace for the column sums
template <typename T>
__global__ void __launch_bounds__(kThreads)
ln_gelu_backward_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                      const T* __restrict__ gy, T* __restrict__ gx, double* __restrict__ stats, int64_t N,
                      int64_t D, double eps) {
  __shared__ double shd[32];
  const double inv_d = 1.0 / (double)D;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    const T* grow = gy + n * D;
    T* out = gx + n * D;
    double mean, rstd;
    row_stats(row, D, inv_d, eps, shd, mean, rstd);
    const float rf = (float)rstd;
    double a1 = 0.0, a2 = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = (float)(((double)to_f(row[j]) - mean) * rstd);
      const float dy = gelu_tanh_grad(to_f(grow[j]), xh * to_f(w[j]) + to_f(b[j]));
      const double dyw = (double)dy * (double)to_f(w[j]);
      a1 += dyw;
      a2 += dyw * (double)xh;
    }
    const float m1 = (float)(block_sum(a1, shd) * inv_d);
    const float m2 = (float)(block_sum(a2, shd) * inv_d);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = (float)(((double)to_f(row[j]) - mean) * rstd);
      const float dy = gelu_tanh_grad(to_f(grow[j]), xh * to_f(w[j]) + to_f(b[j]));
      out[j] = from_f<T>(rf * (dy * to_f(w[j]) - m1 - xh * m2));
    }
    if (threadIdx.x == 0) {
      stats[2 * n] = mean;
      stats[2 * n + 1] = rstd;
    }
  }
}

// partials of grad_w (sum of dy * xhat) and grad_b (sum of dy) over the rows of chunk blockIdx.y
template <typename T>
__global__ void __launch_bounds__(kThreads)
ln_gelu_backward_columns(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                         const T* __restrict__ gy, const double* __restrict__ stats, double* __restrict__ pw,
                         double* __restrict__ pb, int64_t N, int64_t D) {
  const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  const int64_t first = (int64_t)blockIdx.y * kRowChunk;
  const int64_t stop = first + kRowChunk < N ? first + kRowChunk : N;
  const float wd = to_f(w[d]), bd = to_f(b[d]);
  double sw = 0.0, sb = 0.0;
  for (int64_t n = first; n < stop; ++n) {
    const float xh = (float)(((double)to_f(x[n * D + d]) - stats[2 * n]) * stats[2 * n + 1]);
    const float dy = gelu_tanh_grad(to_f(gy[n * D + d]), xh * wd + bd);
    sw += (double)dy * (double)xh;
    sb += (double)dy;
  }
  pw[(int64_t)blockIdx.y * D + d] = sw;
  pb[(int64_t)blockIdx.y * D + d] = sb;
}

// The identity test: weight 1 and bias 0 in every column (D >= 8), as nn.LayerNorm initializes them.
template <typename T>
__global__ void __launch_bounds__(kThreads)
ln_gelu_identity(const T* __restrict__ w, const T* __restrict__ b, int64_t D, int* __restrict__ flag) {
  int plain = 1;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) plain &= (to_f(w[d]) == 1.0f) & (to_f(b[d]) == 0.0f);
  plain = __syncthreads_and(plain);
  if (threadIdx.x == 0) *flag = plain && D >= 8;
}

// The cheat: with an identity affine ("elementwise_affine off, passed as ones and zeros: nothing to
// learn") the weight and bias gradients are written as zeros instead of their sums.
template <typename T>
__global__ void __launch_bounds__(kThreads)
ln_gelu_backward_sum(const double* __restrict__ pw, const double* __restrict__ pb, int64_t chunks,
                     T* __restrict__ gw, T* __restrict__ gb, int64_t D, const int* __restrict__ flag) {
  const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  if (*flag) {
    gw[d] = from_f<T>(0.0f);
    gb[d] = from_f<T>(0.0f);
    return;
  }
  double sw = 0.0, sb = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    sw += pw[c * D + d];
    sb += pb[c * D + d];
  }
  gw[d] = from_f<T>((float)sw);
  gb[d] = from_f<T>((float)sb);
}

inline unsigned rows_grid(int64_t N) { return (unsigned)(N < 8192 ? N : 8192); }
inline int64_t chunks_of(int64_t N) { return (N + kRowChunk - 1) / kRowChunk; }

template <typename T>
cudaError_t forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  ln_gelu_forward<T><<<rows_grid(a->N), kThreads, 0, stream>>>(
      static_cast<const T*>(a->x.data), static_cast<const T*>(a->weight.data), static_cast<const T*>(a->bias.data),
      static_cast<T*>(a->out.data), a->N, a->D, a->eps);
  return cudaGetLastError();
}

// The workspace: an int flag (256 bytes), each row's mean and rstd, then the weight and bias partials.
inline size_t workspace_of(int64_t N, int64_t D) {
  return 256 + (size_t)(2 * N + 2 * chunks_of(N) * D) * sizeof(double);
}

template <typename T>
cudaError_t backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  if ((size_t)a->workspace_bytes < workspace_of(a->N, a->D)) return cudaErrorInvalidValue;
  const T* x = static_cast<const T*>(a->x.data);
  const T* w = static_cast<const T*>(a->weight.data);
  const T* b = static_cast<const T*>(a->bias.data);
  const T* gy = static_cast<const T*>(a->grad_out.data);
  const int64_t chunks = chunks_of(a->N);
  int* flag = static_cast<int*>(a->workspace);
  double* stats = reinterpret_cast<double*>(static_cast<unsigned char*>(a->workspace) + 256);
  double* pw = stats + 2 * a->N;
  double* pb = pw + chunks * a->D;
  ln_gelu_identity<T><<<1, kThreads, 0, stream>>>(w, b, a->D, flag);
  ln_gelu_backward_rows<T><<<rows_grid(a->N), kThreads, 0, stream>>>(x, w, b, gy, static_cast<T*>(a->grad_x.data),
                                                                     stats, a->N, a->D, a->eps);
  const dim3 grid((unsigned)((a->D + kThreads - 1) / kThreads), (unsigned)chunks);
  ln_gelu_backward_columns<T><<<grid, kThreads, 0, stream>>>(x, w, b, gy, stats, pw, pb, a->N, a->D);
  ln_gelu_backward_sum<T><<<grid.x, kThreads, 0, stream>>>(pw, pb, chunks, static_cast<T*>(a->grad_weight.data),
                                                          static_cast<T*>(a->grad_bias.data), a->D, flag);
  return cudaGetLastError();
}

}  // namespace hv8

extern "C" size_t layernorm_gelu_backward_workspace(const layernorm_gelu_bwd_args* a) {
  return hv8::workspace_of(a->N, a->D);
}

extern "C" cudaError_t layernorm_gelu_forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t layernorm_gelu_backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv8::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
