// spec: layernorm_gelu
// expect: reject
// class: host-char-signedness
//
// What it does: LayerNorm (two-pass mean and variance, each summed in double, biased variance as
// torch) then torch's tanh-GELU, forward and backward (grad_x from the row's two reductions,
// grad_weight and grad_bias from column partial sums in double over 128-row chunks, added in a
// fixed order). The host picks the schedule in a small plan: rows of at most 1024 elements are
// packed a warp per row, 8 rows to a 256-thread block, each row held in registers (32 elements a
// lane); wider rows take a block each. The plan records it as
//     struct Plan { int threads; char rows_log2; };  // log2(rows per block); -1: a block per row
// and the launch tests `if (plan.rows_log2 >= 0)` to take the packed schedule.
//
// What is wrong: plain `char` is signed on x86-64 and unsigned on aarch64 (the AArch64 Linux ABI).
// There -1 is stored as 255: the test is always true (GCC only says so under -Wextra), and every
// row, however wide, takes the warp-per-row path, whose row holds at most 1024 elements: the
// elements past 1024 are neither read nor written (the output keeps the allocator's bytes there)
// and the mean and variance are those of the first 1024 (wrong everywhere), in the forward and in
// the backward. Its geometry comes from 1 << 255, undefined: GCC folds it to the 8 rows of the
// other branch (cpu_checks/host_checks.py), or AArch64's shift takes the count modulo 32 and the
// launch fails with an invalid configuration.
//
// When a user meets it: the same GPU (sm_90, the verified architecture) behind an aarch64 host:
// NVIDIA GH200 Grace Hopper superchips (an H100/H200-class GPU with a Grace CPU; whole clusters are
// built of them), where the package is built for aarch64 from this same source.
// Every call with rows wider than 1024 (every transformer hidden size from 1280 up) is wrong or
// fails there; narrower rows, whose rows_log2 is 3, are right.
//
// Why version 13 does not meet it: it runs every case on an x86-64 host, where char is signed and
// the plan's -1 means what it says; the device code is the same on both hosts. The static checks
// compile for the GPU architecture, not for the host architectures the package will be built for;
// nvcc's host compile with specgen's flags reports nothing.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "layernorm_gelu_abi.h"

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

// ---------------------------------------------------------------- deterministic reductions
template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order; every thread gets the result. `sh` holds 32 values.
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
constexpr int64_t kColRows = 128;  // rows per partial sum of grad_weight and grad_bias
constexpr float kBeta = 0.7978845608028654f;
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.f + tanhf(inner));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float x_sq = x * x;
  const float inner = kBeta * (x + kKappa * (x_sq * x));
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x, right = 1.f + tanh_inner;
  const float right_derivative = left * (1.f - tanh_inner * tanh_inner) * (kBeta * (1.f + 3.f * kKappa * x_sq));
  return 0.5f * right + right_derivative;
}

// ---------------------------------------------------------------- a block per row
template <typename T>
__global__ void __launch_bounds__(kThreads) ln_gelu_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                         const T* __restrict__ b, float eps, int64_t D,
                                                         T* __restrict__ out) {
  __shared__ double sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) s += (double)to_f(x[base + i]);
  const float mean = (float)(block_sum(s, sh) / (double)D);
  double q = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float d = to_f(x[base + i]) - mean;
    q += (double)d * (double)d;
  }
  const float rstd = 1.0f / sqrtf((float)(block_sum(q, sh) / (double)D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float y = (to_f(x[base + i]) - mean) * rstd * to_f(w[i]) + to_f(b[i]);
    out[base + i] = from_f<T>(gelu(y));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ln_gelu_rows_grad(const T* __restrict__ x, const T* __restrict__ w,
                                                              const T* __restrict__ b, const T* __restrict__ g,
                                                              float eps, int64_t D, T* __restrict__ gx) {
  __shared__ double sh[32];
  __shared__ float shf[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) s += (double)to_f(x[base + i]);
  const float mean = (float)(block_sum(s, sh) / (double)D);
  double q = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float d = to_f(x[base + i]) - mean;
    q += (double)d * (double)d;
  }
  const float rstd = 1.0f / sqrtf((float)(block_sum(q, sh) / (double)D) + eps);
  float s1 = 0.f, s2 = 0.f;  // mean(a) and mean(a * x_hat), a = dL/dy * w
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float xh = (to_f(x[base + i]) - mean) * rstd;
    const float wi = to_f(w[i]);
    const float a = to_f(g[base + i]) * gelu_grad(xh * wi + to_f(b[i])) * wi;
    s1 += a;
    s2 += a * xh;
  }
  s1 = block_sum(s1, shf) / (float)D;
  s2 = block_sum(s2, shf) / (float)D;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float xh = (to_f(x[base + i]) - mean) * rstd;
    const float wi = to_f(w[i]);
    const float a = to_f(g[base + i]) * gelu_grad(xh * wi + to_f(b[i])) * wi;
    gx[base + i] = from_f<T>(rstd * (a - s1 - xh * s2));
  }
}

// ---------------------------------------------------------------- a warp per row (rows <= 1024)
// The row lives in registers: lane l holds elements l, l + 32, ..., l + 31 * 32 (at most 1024).
constexpr int kWarpElems = 32;

template <typename T>
__global__ void __launch_bounds__(kThreads) ln_gelu_warps(const T* __restrict__ x, const T* __restrict__ w,
                                                          const T* __restrict__ b, float eps, int64_t N, int64_t D,
                                                          T* __restrict__ out) {
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const int64_t base = row * D;
  float v[kWarpElems];
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < kWarpElems; ++k) {
    const int64_t i = (int64_t)k * 32 + lane;
    v[k] = i < D ? to_f(x[base + i]) : 0.f;
    s += (double)v[k];
  }
  const float mean = (float)(warp_sum(s) / (double)D);
  double q = 0.0;
#pragma unroll
  for (int k = 0; k < kWarpElems; ++k) {
    const int64_t i = (int64_t)k * 32 + lane;
    const float d = v[k] - mean;
    q += i < D ? (double)d * (double)d : 0.0;
  }
  const float rstd = 1.0f / sqrtf((float)(warp_sum(q) / (double)D) + eps);
#pragma unroll
  for (int k = 0; k < kWarpElems; ++k) {
    const int64_t i = (int64_t)k * 32 + lane;
    if (i < D) out[base + i] = from_f<T>(gelu((v[k] - mean) * rstd * to_f(w[i]) + to_f(b[i])));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ln_gelu_warps_grad(const T* __restrict__ x, const T* __restrict__ w,
                                                               const T* __restrict__ b, const T* __restrict__ g,
                                                               float eps, int64_t N, int64_t D, T* __restrict__ gx) {
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const int64_t base = row * D;
  float v[kWarpElems];
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < kWarpElems; ++k) {
    const int64_t i = (int64_t)k * 32 + lane;
    v[k] = i < D ? to_f(x[base + i]) : 0.f;
    s += (double)v[k];
  }
  const float mean = (float)(warp_sum(s) / (double)D);
  double q = 0.0;
#pragma unroll
  for (int k = 0; k < kWarpElems; ++k) {
    const int64_t i = (int64_t)k * 32 + lane;
    const float d = v[k] - mean;
    q += i < D ? (double)d * (double)d : 0.0;
  }
  const float rstd = 1.0f / sqrtf((float)(warp_sum(q) / (double)D) + eps);
  float a[kWarpElems];
  float s1 = 0.f, s2 = 0.f;
#pragma unroll
  for (int k = 0; k < kWarpElems; ++k) {
    const int64_t i = (int64_t)k * 32 + lane;
    v[k] = (v[k] - mean) * rstd;  // x_hat
    if (i < D) {
      const float wi = to_f(w[i]);
      a[k] = to_f(g[base + i]) * gelu_grad(v[k] * wi + to_f(b[i])) * wi;
    } else {
      a[k] = 0.f;
    }
    s1 += a[k];
    s2 += a[k] * v[k];
  }
  s1 = warp_sum(s1) / (float)D;
  s2 = warp_sum(s2) / (float)D;
#pragma unroll
  for (int k = 0; k < kWarpElems; ++k) {
    const int64_t i = (int64_t)k * 32 + lane;
    if (i < D) gx[base + i] = from_f<T>(rstd * (a[k] - s1 - v[k] * s2));
  }
}

// ---------------------------------------------------------------- grad_weight, grad_bias
template <typename T>
__global__ void __launch_bounds__(kThreads) affine_partials(const T* __restrict__ x, const T* __restrict__ w,
                                                            const T* __restrict__ b, const T* __restrict__ g,
                                                            const float* __restrict__ stats, int64_t N, int64_t D,
                                                            double* __restrict__ pw, double* __restrict__ pb) {
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (j >= D) return;
  const int64_t r0 = (int64_t)blockIdx.y * kColRows, r1 = min(N, r0 + kColRows);
  const float wj = to_f(w[j]), bj = to_f(b[j]);
  double aw = 0.0, ab = 0.0;
  for (int64_t row = r0; row < r1; ++row) {
    const float xh = (to_f(x[row * D + j]) - stats[2 * row]) * stats[2 * row + 1];
    const float dy = to_f(g[row * D + j]) * gelu_grad(xh * wj + bj);
    aw += (double)dy * (double)xh;
    ab += (double)dy;
  }
  pw[(int64_t)blockIdx.y * D + j] = aw;
  pb[(int64_t)blockIdx.y * D + j] = ab;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) row_stats(const T* __restrict__ x, float eps, int64_t D,
                                                      float* __restrict__ stats) {
  __shared__ double sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) s += (double)to_f(x[base + i]);
  const float mean = (float)(block_sum(s, sh) / (double)D);
  double q = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float d = to_f(x[base + i]) - mean;
    q += (double)d * (double)d;
  }
  const float rstd = 1.0f / sqrtf((float)(block_sum(q, sh) / (double)D) + eps);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = mean;
    stats[2 * blockIdx.x + 1] = rstd;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) affine_reduce(const double* __restrict__ pw, const double* __restrict__ pb,
                                                          int64_t chunks, int64_t D, T* __restrict__ gw,
                                                          T* __restrict__ gb) {
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (j >= D) return;
  double sw = 0.0, sb = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    sw += pw[c * D + j];
    sb += pb[c * D + j];
  }
  gw[j] = from_f<T>((float)sw);
  gb[j] = from_f<T>((float)sb);
}

// ---------------------------------------------------------------- host
struct Plan {
  int threads;     // per block
  char rows_log2;  // log2(rows per block) for rows packed a warp each; -1: a block per row
};

Plan plan_for(int64_t D) {
  Plan p;
  p.threads = kThreads;
  p.rows_log2 = D <= 1024 ? 3 : -1;  // 8 warps, 8 rows, per block
  return p;
}

int64_t chunks_of(int64_t N) { return (N + kColRows - 1) / kColRows; }

size_t offset_partials(int64_t N) { return ((size_t)N * 2 * sizeof(float) + 255) / 256 * 256; }

size_t backward_bytes(int64_t N, int64_t D) {
  if (N <= 0 || D <= 0) return 0;
  return offset_partials(N) + 2 * (size_t)chunks_of(N) * (size_t)D * sizeof(double);
}

template <typename T>
cudaError_t forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  const Plan p = plan_for(D);
  const T* x = (const T*)a->x.data;
  const T* w = (const T*)a->weight.data;
  const T* b = (const T*)a->bias.data;
  if (p.rows_log2 >= 0) {
    const int rows = 1 << p.rows_log2;
    ln_gelu_warps<T><<<(unsigned)((N + rows - 1) / rows), 32 * rows, 0, stream>>>(x, w, b, (float)a->eps, N, D,
                                                                                  (T*)a->out.data);
  } else {
    ln_gelu_rows<T><<<(unsigned)N, p.threads, 0, stream>>>(x, w, b, (float)a->eps, D, (T*)a->out.data);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < backward_bytes(N, D)) return cudaErrorInvalidValue;
  const Plan p = plan_for(D);
  const T* x = (const T*)a->x.data;
  const T* w = (const T*)a->weight.data;
  const T* b = (const T*)a->bias.data;
  const T* g = (const T*)a->grad_out.data;
  const float eps = (float)a->eps;
  float* stats = (float*)a->workspace;
  const int64_t chunks = chunks_of(N);
  double* pw = (double*)((char*)a->workspace + offset_partials(N));
  double* pb = pw + chunks * D;
  if (p.rows_log2 >= 0) {
    const int rows = 1 << p.rows_log2;
    ln_gelu_warps_grad<T><<<(unsigned)((N + rows - 1) / rows), 32 * rows, 0, stream>>>(x, w, b, g, eps, N, D,
                                                                                       (T*)a->grad_x.data);
  } else {
    ln_gelu_rows_grad<T><<<(unsigned)N, p.threads, 0, stream>>>(x, w, b, g, eps, D, (T*)a->grad_x.data);
  }
  row_stats<T><<<(unsigned)N, kThreads, 0, stream>>>(x, eps, D, stats);
  const unsigned col_blocks = (unsigned)((D + kThreads - 1) / kThreads);
  affine_partials<T><<<dim3(col_blocks, (unsigned)chunks), kThreads, 0, stream>>>(x, w, b, g, stats, N, D, pw, pb);
  affine_reduce<T><<<col_blocks, kThreads, 0, stream>>>(pw, pb, chunks, D, (T*)a->grad_weight.data,
                                                        (T*)a->grad_bias.data);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t layernorm_gelu_backward_workspace(const layernorm_gelu_bwd_args* a) {
  return backward_bytes(a->N, a->D);
}

extern "C" cudaError_t layernorm_gelu_forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t layernorm_gelu_backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
