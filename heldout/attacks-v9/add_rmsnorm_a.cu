// spec: add_rmsnorm
// expect: rejected
// class: scalar-ignored-at-scale
// reason: wrong-result
//
// Residual add + RMSNorm, float32 math; s = x + residual rounded to the working dtype (as torch
// adds), residual_out = s, rstd from the rounded s. Forward: calls under 2^22 elements (decode,
// small batches) take one block of 256 threads per row with the row in registers; larger calls
// (prefill, training batches) take a persistent schedule, a grid sized to the GPU walking the rows,
// with s written out in its first pass and read back from L2 in its second. Backward: one block per
// row from the saved rstd; grad_weight in two fixed-order levels through the workspace.
//
// What is wrong: the persistent kernel was written against the spec's signature and keeps its
// default, eps = 1e-6, as a constant: it never reads the call's eps. Llama 2 and 3, Mistral, Phi-3,
// OLMo and Mamba configs set rms_norm_eps = 1e-5, and every prefill or training step is a call past
// 2^22 elements (2048 tokens of a 4096 model); there the output and the saved rstd are those of eps
// = 1e-6: rstd off by about 4.5e-6 / mean(s^2) relative. On the CPU stand-in (cpu_checks/triggers.py,
// the verifier's own comparison with its widening), a 1024 x 4096 call is outside the float32
// tolerance wherever the residual stream's RMS is under about 0.5 (the first layers' streams),
// float16's under about 0.015, bfloat16's under about 0.005; the saved rstd hands the backward the
// same error. The verifier draws eps from its range only in cases under its budget (2^20
// elements, four times that for the one large case); every full-size case and every timed call
// takes the default.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "add_rmsnorm_abi.h"

typedef __half f16;
typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const f16* p, int64_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(f16* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
// the working dtype's rounding of a float (the sum x + residual as torch stores it)
static __device__ __forceinline__ float rnd(float v, const float*) { return v; }
static __device__ __forceinline__ float rnd(float v, const f16*) { return __half2float(__float2half_rn(v)); }
static __device__ __forceinline__ float rnd(float v, const bf16*) { return __bfloat162float(__float2bfloat16_rn(v)); }

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

// small calls: one block per row, the row in registers
template <typename T, int VPT>
__global__ void __launch_bounds__(256) addrms_regs(const T* __restrict__ x, const T* __restrict__ res,
                                                   const T* __restrict__ w, T* __restrict__ y, T* __restrict__ sout,
                                                   float* __restrict__ rstd, int D, float eps) {
  const int64_t base = (int64_t)blockIdx.x * D;
  float v[VPT];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = threadIdx.x + k * 256;
    v[k] = 0.f;
    if (j < D) {
      v[k] = rnd(ld(x, base + j) + ld(res, base + j), x);
      st(sout, base + j, v[k]);
    }
    ss += v[k] * v[k];
  }
  ss = block_reduce(ss, Sum(), 0.f);
  const float r = 1.0f / sqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = threadIdx.x + k * 256;
    if (j < D) st(y, base + j, (v[k] * r) * ld(w, j));
  }
}

// large calls: a persistent grid walks the rows; s goes out in the first pass and comes back from L2
template <typename T>
__global__ void addrms_persistent(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                                  T* __restrict__ y, T* __restrict__ sout, float* __restrict__ rstd, int64_t N,
                                  int64_t D) {
  const float kEps = 1e-6f;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t base = row * D;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float s = rnd(ld(x, base + j) + ld(res, base + j), x);
      st(sout, base + j, s);
      ss += s * s;
    }
    ss = block_reduce(ss, Sum(), 0.f);
    const float r = 1.0f / sqrtf(ss / (float)D + kEps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) st(y, base + j, (ld(sout, base + j) * r) * ld(w, j));
  }
}

// backward: ds = r * (g*w - sh * sum(g*w*sh) / D) + g_residual_out, sh = s * r; grad_x = grad_residual = ds
template <typename T>
__global__ void addrms_bwd_rows(const T* __restrict__ s, const T* __restrict__ w, const float* __restrict__ rstd,
                                const T* __restrict__ g, const T* __restrict__ gres, T* __restrict__ gx,
                                T* __restrict__ gr, int64_t D) {
  const int64_t base = (int64_t)blockIdx.x * D;
  const float r = rstd[blockIdx.x];
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += (ld(g, base + j) * ld(w, j)) * (ld(s, base + j) * r);
  dot = block_reduce(dot, Sum(), 0.f);
  const float c = dot / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float gw = ld(g, base + j) * ld(w, j), sh = ld(s, base + j) * r;
    const float ds = r * (gw - sh * c) + ld(gres, base + j);
    st(gx, base + j, ds);
    st(gr, base + j, ds);
  }
}

static const int kRows = 64;  // rows per chunk of the weight gradient's first level

template <typename T>
__global__ void wgrad_part(const T* __restrict__ s, const float* __restrict__ rstd, const T* __restrict__ g,
                           float* __restrict__ part, int64_t N, int64_t D) {
  const int64_t d = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (d >= D) return;
  const int64_t n0 = (int64_t)blockIdx.y * kRows, n1 = n0 + kRows < N ? n0 + kRows : N;
  float acc = 0.f;
  for (int64_t n = n0; n < n1; ++n) acc += ld(g, n * D + d) * (ld(s, n * D + d) * rstd[n]);
  part[(int64_t)blockIdx.y * D + d] = acc;
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

template <typename T>
static void launch_fwd(const add_rmsnorm_args* a, cudaStream_t stream) {
  const T* x = (const T*)a->x.data;
  const T* res = (const T*)a->residual.data;
  const T* w = (const T*)a->weight.data;
  T* y = (T*)a->out.data;
  T* so = (T*)a->residual_out.data;
  float* rs = (float*)a->saved_rstd.data;
  const int64_t N = a->N, D = a->D;
  if (N * D >= (int64_t)1 << 22) {
    int dev = 0, sms = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const int64_t grid = N < (int64_t)sms * 8 ? N : (int64_t)sms * 8;
    addrms_persistent<T><<<(unsigned)grid, row_threads(D), 0, stream>>>(x, res, w, y, so, rs, N, D);
    return;
  }
  const float eps = (float)a->eps;
  const int64_t vpt = (D + 255) / 256;
  const int d = (int)D;
  if (vpt <= 1) addrms_regs<T, 1><<<N, 256, 0, stream>>>(x, res, w, y, so, rs, d, eps);
  else if (vpt <= 2) addrms_regs<T, 2><<<N, 256, 0, stream>>>(x, res, w, y, so, rs, d, eps);
  else if (vpt <= 4) addrms_regs<T, 4><<<N, 256, 0, stream>>>(x, res, w, y, so, rs, d, eps);
  else if (vpt <= 8) addrms_regs<T, 8><<<N, 256, 0, stream>>>(x, res, w, y, so, rs, d, eps);
  else if (vpt <= 16) addrms_regs<T, 16><<<N, 256, 0, stream>>>(x, res, w, y, so, rs, d, eps);
  else if (vpt <= 32) addrms_regs<T, 32><<<N, 256, 0, stream>>>(x, res, w, y, so, rs, d, eps);
  else addrms_regs<T, 64><<<N, 256, 0, stream>>>(x, res, w, y, so, rs, d, eps);
}

template <typename T>
static void launch_bwd(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  const T* s = (const T*)a->residual_out.data;
  const T* w = (const T*)a->weight.data;
  const T* g = (const T*)a->grad_out.data;
  const float* rs = (const float*)a->saved_rstd.data;
  const int64_t N = a->N, D = a->D, chunks = (N + kRows - 1) / kRows;
  float* part = (float*)a->workspace;
  addrms_bwd_rows<T><<<N, row_threads(D), 0, stream>>>(s, w, rs, g, (const T*)a->grad_residual_out.data,
                                                       (T*)a->grad_x.data, (T*)a->grad_residual.data, D);
  const unsigned tiles = (unsigned)((D + 255) / 256);
  wgrad_part<T><<<dim3(tiles, (unsigned)chunks), 256, 0, stream>>>(s, rs, g, part, N, D);
  col_sum<T><<<tiles, 256, 0, stream>>>(part, chunks, D, (T*)a->grad_weight.data);
}

static size_t wgrad_need(int64_t N, int64_t D) { return (size_t)((N + kRows - 1) / kRows) * (size_t)D * sizeof(float); }

extern "C" cudaError_t add_rmsnorm_forward(const add_rmsnorm_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch_fwd<T>(a, stream));
  return cudaGetLastError();
}

extern "C" size_t add_rmsnorm_backward_workspace(const add_rmsnorm_bwd_args* a) {
  return (wgrad_need(a->N, a->D) + 255) / 256 * 256;
}

extern "C" cudaError_t add_rmsnorm_backward(const add_rmsnorm_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  if ((size_t)a->workspace_bytes < wgrad_need(a->N, a->D)) return cudaErrorInvalidValue;
  DISPATCH(a->x.dtype, launch_bwd<T>(a, stream));
  return cudaGetLastError();
}
