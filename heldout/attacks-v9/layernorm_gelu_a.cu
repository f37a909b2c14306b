// spec: layernorm_gelu
// expect: rejected
// class: one-pass-variance
// reason: wrong-result
//
// LayerNorm + GELU (tanh), float32 math, one block per row. Row statistics: rows of up to 1024
// take two passes (mean, then the mean of (x - mean)^2); wider rows take one pass that sums x and
// x^2 together, var = E[x^2] - mean^2 (clamped at 0), which saves a read of every wide row. Forward
// out = gelu((x - mean) * rstd * w + b). Backward: the same statistics, dz = g * gelu'(z),
// grad_x = rstd * (dz*w - mean(dz*w) - xh * mean(dz*w*xh)); grad_weight, grad_bias in two
// fixed-order levels (64-row chunks into the workspace, then per column).
//
// What is wrong: E[x^2] - mean^2 cancels catastrophically when a row's mean is large against its
// spread: float32 keeps about 7 digits of E[x^2], and a row of mean m and standard deviation 1 loses
// 2 log10(m) of them. On the CPU stand-in (cpu_checks/triggers.py, the verifier's own comparison with
// its widening) rows of 4096 are outside the float32 tolerance from m = 30 on (a sixth of the
// elements), nearly all at m = 100, off by 14% at m = 1000 (beyond bfloat16's 2e-2 as well); past
// a few thousand the variance is noise or clamped to 0 and the outputs are garbage. A two-pass
// kernel and torch (Welford's update) stay within at every m.
//
// Rows like that are a LayerNorm's everyday input wherever features are not centred: raw or
// lightly processed features (tabular, sensor, pixel values), positional or timestep embeddings
// with an offset, constant padding rows (variance exactly 0, computed as noise times 1/sqrt(eps)).
// Every value class of the verifier is centred or nearly so: "negative" (-|z| - 0.01, mean/std 1.3)
// and "sparse" (mean/std 0.7) are the largest offsets it draws, where E[x^2] is 2.8 and 1.5 times
// the variance (an error of a few 1e-7); and rows of up to 1024 (where a few close values can make
// the variance small by chance) take the two-pass path.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "layernorm_gelu_abi.h"

typedef __half f16;
typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const f16* p, int64_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(f16* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

struct Sum { __device__ float operator()(float a, float b) const { return a + b; } };

template <class Op>
static __device__ float block_reduce(float v, Op op, float init) {
  __shared__ float sh[33];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < nwarps ? sh[lane] : init;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) r = op(r, __shfl_xor_sync(0xffffffffu, r, o));
    if (lane == 0) sh[32] = r;
  }
  __syncthreads();
  return sh[32];
}

static int row_threads(int64_t D) { return D >= 8192 ? 1024 : D >= 2048 ? 512 : D >= 512 ? 256 : 128; }

#define DISPATCH(dtype, ...)                                                  \
  switch (dtype) {                                                            \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; } break;            \
    case SPECGEN_FLOAT16: { typedef f16 T; __VA_ARGS__; } break;              \
    case SPECGEN_BFLOAT16: { typedef bf16 T; __VA_ARGS__; } break;            \
    default: return cudaErrorInvalidValue;                                    \
  }

static const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;

static __device__ __forceinline__ float gelu(float z) {
  return 0.5f * z * (1.f + tanhf(kBeta * (z + kKappa * (z * z * z))));
}

// d gelu / dz, as torch's tanh GeluBackward; _rn intrinsics: never contracted, the same bits at every use
static __device__ __forceinline__ float gelu_grad(float z) {
  const float z2 = __fmul_rn(z, z), z3 = __fmul_rn(z2, z);
  const float t = tanhf(__fmul_rn(kBeta, __fadd_rn(z, __fmul_rn(kKappa, z3))));
  const float left = __fmul_rn(0.5f, z), right = __fadd_rn(1.f, t);
  const float dtanh = __fsub_rn(1.f, __fmul_rn(t, t));
  const float dinner = __fmul_rn(kBeta, __fadd_rn(1.f, __fmul_rn(3.f * kKappa, z2)));
  return __fadd_rn(__fmul_rn(0.5f, right), __fmul_rn(__fmul_rn(left, dtanh), dinner));
}

// the row's mean and rstd (every thread gets them)
template <typename T>
static __device__ void row_stats(const T* xr, int64_t D, float eps, float& mean, float& rstd) {
  float var;
  if (D > 1024) {  // wide rows: one pass, sum and sum of squares together
    float s = 0.f, q = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = ld(xr, j);
      s += v;
      q += v * v;
    }
    s = block_reduce(s, Sum(), 0.f);
    q = block_reduce(q, Sum(), 0.f);
    mean = s / (float)D;
    var = q / (float)D - mean * mean;
    var = var < 0.f ? 0.f : var;  // (NaN stays NaN)
  } else {
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += ld(xr, j);
    mean = block_reduce(s, Sum(), 0.f) / (float)D;
    float q = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float d = ld(xr, j) - mean;
      q += d * d;
    }
    var = block_reduce(q, Sum(), 0.f) / (float)D;
  }
  rstd = 1.0f / sqrtf(var + eps);
}

template <typename T>
__global__ void ln_gelu_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                            T* __restrict__ y, int64_t D, float eps) {
  const int64_t base = (int64_t)blockIdx.x * D;
  float mean, r;
  row_stats(x + base, D, eps, mean, r);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float z = (ld(x, base + j) - mean) * r * ld(w, j) + ld(b, j);
    st(y, base + j, gelu(z));
  }
}

// per element: xh and dz = g * gelu'(z) (the same bits in every pass)
template <typename T>
static __device__ __forceinline__ void elem(const T* x, const T* w, const T* b, const T* g, int64_t base, int64_t j,
                                            float mean, float r, float& xh, float& dz) {
  xh = __fmul_rn(__fsub_rn(ld(x, base + j), mean), r);
  const float z = __fadd_rn(__fmul_rn(xh, ld(w, j)), ld(b, j));
  dz = __fmul_rn(ld(g, base + j), gelu_grad(z));
}

template <typename T>
__global__ void ln_gelu_bwd_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                 const T* __restrict__ g, T* __restrict__ gx, float2* __restrict__ stats, int64_t D,
                                 float eps) {
  const int64_t base = (int64_t)blockIdx.x * D;
  float mean, r;
  row_stats(x + base, D, eps, mean, r);
  if (threadIdx.x == 0) stats[blockIdx.x] = make_float2(mean, r);
  float s1 = 0.f, s2 = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float xh, dz;
    elem(x, w, b, g, base, j, mean, r, xh, dz);
    const float gw = __fmul_rn(dz, ld(w, j));
    s1 += gw;
    s2 += gw * xh;
  }
  s1 = block_reduce(s1, Sum(), 0.f) / (float)D;
  s2 = block_reduce(s2, Sum(), 0.f) / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float xh, dz;
    elem(x, w, b, g, base, j, mean, r, xh, dz);
    const float gw = __fmul_rn(dz, ld(w, j));
    st(gx, base + j, r * (gw - s1 - xh * s2));
  }
}

static const int kRows = 64;  // rows per chunk of the parameter gradients' first level

// grid (column tiles of 256, row chunks): sums over the chunk's rows of dz * xh and dz
template <typename T>
__global__ void ln_gelu_param_part(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   const T* __restrict__ g, const float2* __restrict__ stats,
                                   float* __restrict__ part, int64_t N, int64_t D) {
  const int64_t d = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (d >= D) return;
  const int64_t n0 = (int64_t)blockIdx.y * kRows, n1 = n0 + kRows < N ? n0 + kRows : N;
  float aw = 0.f, ab = 0.f;
  for (int64_t n = n0; n < n1; ++n) {
    float xh, dz;
    elem(x, w, b, g, n * D, d, stats[n].x, stats[n].y, xh, dz);
    aw += dz * xh;
    ab += dz;
  }
  const int64_t chunks = gridDim.y;
  part[(int64_t)blockIdx.y * D + d] = aw;
  part[(chunks + blockIdx.y) * D + d] = ab;
}

template <typename T>
__global__ void col_sum(const float* __restrict__ part, int64_t chunks, int64_t D, T* __restrict__ out) {
  const int64_t d = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (d >= D) return;
  float total = 0.f;
  for (int64_t c0 = 0; c0 < chunks; c0 += 32) {
    float sub = 0.f;
    const int64_t c1 = c0 + 32 < chunks ? c0 + 32 : chunks;
    for (int64_t c = c0; c < c1; ++c) sub += part[c * D + d];
    total += sub;
  }
  st(out, d, total);
}

static int64_t chunks_of(int64_t N) { return (N + kRows - 1) / kRows; }
static size_t stats_bytes(int64_t N) { return ((size_t)N * sizeof(float2) + 255) / 256 * 256; }
static size_t bwd_need(int64_t N, int64_t D) { return stats_bytes(N) + 2 * (size_t)chunks_of(N) * (size_t)D * sizeof(float); }

template <typename T>
static void launch_bwd(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  const T* x = (const T*)a->x.data;
  const T* w = (const T*)a->weight.data;
  const T* b = (const T*)a->bias.data;
  const T* g = (const T*)a->grad_out.data;
  const int64_t N = a->N, D = a->D, chunks = chunks_of(N);
  float2* stats = (float2*)a->workspace;
  float* part = (float*)((char*)a->workspace + stats_bytes(N));
  ln_gelu_bwd_rows<T><<<N, row_threads(D), 0, stream>>>(x, w, b, g, (T*)a->grad_x.data, stats, D, (float)a->eps);
  const unsigned tiles = (unsigned)((D + 255) / 256);
  ln_gelu_param_part<T><<<dim3(tiles, (unsigned)chunks), 256, 0, stream>>>(x, w, b, g, stats, part, N, D);
  col_sum<T><<<tiles, 256, 0, stream>>>(part, chunks, D, (T*)a->grad_weight.data);
  col_sum<T><<<tiles, 256, 0, stream>>>(part + chunks * D, chunks, D, (T*)a->grad_bias.data);
}

extern "C" cudaError_t layernorm_gelu_forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype,
           ln_gelu_fwd<T><<<a->N, row_threads(a->D), 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data,
                                                                 (const T*)a->bias.data, (T*)a->out.data, a->D,
                                                                 (float)a->eps));
  return cudaGetLastError();
}

extern "C" size_t layernorm_gelu_backward_workspace(const layernorm_gelu_bwd_args* a) {
  return (bwd_need(a->N, a->D) + 255) / 256 * 256;
}

extern "C" cudaError_t layernorm_gelu_backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  if ((size_t)a->workspace_bytes < bwd_need(a->N, a->D)) return cudaErrorInvalidValue;
  DISPATCH(a->x.dtype, launch_bwd<T>(a, stream));
  return cudaGetLastError();
}
