// spec: rmsnorm
// expect: passed
// class: control
// reason: passed
//
// RMSNorm, float32 math. Forward: one block of 256 threads per row, the row kept in registers (up
// to 64 values a thread: every width of the range), one read and one write; saved rstd. Backward:
// one block per row for grad_x = r * (g*w - xh * sum(g*w*xh) / D), xh = x * r, from the saved rstd;
// grad_weight = sum over rows of g * xh in two fixed-order levels (64-row chunks into the workspace,
// then the chunks per column, 32 at a time): deterministic, and about as accurate as a tree.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "rmsnorm_abi.h"

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

template <typename T, int VPT>
__global__ void __launch_bounds__(256) rms_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                               float* __restrict__ rstd, int D, float eps) {
  const T* xr = x + (int64_t)blockIdx.x * D;
  T* yr = y + (int64_t)blockIdx.x * D;
  float v[VPT];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = threadIdx.x + k * 256;
    v[k] = j < D ? ld(xr, j) : 0.f;
    ss += v[k] * v[k];
  }
  ss = block_reduce(ss, Sum(), 0.f);
  const float r = 1.0f / sqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = threadIdx.x + k * 256;
    if (j < D) st(yr, j, (v[k] * r) * ld(w, j));
  }
}

template <typename T>
__global__ void rms_bwd_rows(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd,
                             const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const int64_t base = (int64_t)blockIdx.x * D;
  const float r = rstd[blockIdx.x];
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += (ld(g, base + j) * ld(w, j)) * (ld(x, base + j) * r);
  dot = block_reduce(dot, Sum(), 0.f);
  const float c = dot / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float gw = ld(g, base + j) * ld(w, j), xh = ld(x, base + j) * r;
    st(gx, base + j, r * (gw - xh * c));
  }
}

static const int kRows = 64;  // rows per chunk of the weight gradient's first level

// grid (column tiles of 256, row chunks): part[chunk][d] = sum over the chunk's rows of g * x * r
template <typename T>
__global__ void rms_wgrad_part(const T* __restrict__ x, const float* __restrict__ rstd, const T* __restrict__ g,
                               float* __restrict__ part, int64_t N, int64_t D) {
  const int64_t d = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (d >= D) return;
  const int64_t n0 = (int64_t)blockIdx.y * kRows, n1 = n0 + kRows < N ? n0 + kRows : N;
  float acc = 0.f;
  for (int64_t n = n0; n < n1; ++n) acc += ld(g, n * D + d) * (ld(x, n * D + d) * rstd[n]);
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
static void launch_fwd(const rmsnorm_args* a, cudaStream_t stream) {
  const T* x = (const T*)a->x.data;
  const T* w = (const T*)a->weight.data;
  T* y = (T*)a->out.data;
  float* rs = (float*)a->saved_rstd.data;
  const int64_t N = a->N, D = a->D;
  const float eps = (float)a->eps;
  const int64_t vpt = (D + 255) / 256;
  const int d = (int)D;
  if (vpt <= 1) rms_fwd<T, 1><<<N, 256, 0, stream>>>(x, w, y, rs, d, eps);
  else if (vpt <= 2) rms_fwd<T, 2><<<N, 256, 0, stream>>>(x, w, y, rs, d, eps);
  else if (vpt <= 4) rms_fwd<T, 4><<<N, 256, 0, stream>>>(x, w, y, rs, d, eps);
  else if (vpt <= 8) rms_fwd<T, 8><<<N, 256, 0, stream>>>(x, w, y, rs, d, eps);
  else if (vpt <= 16) rms_fwd<T, 16><<<N, 256, 0, stream>>>(x, w, y, rs, d, eps);
  else if (vpt <= 32) rms_fwd<T, 32><<<N, 256, 0, stream>>>(x, w, y, rs, d, eps);
  else rms_fwd<T, 64><<<N, 256, 0, stream>>>(x, w, y, rs, d, eps);
}

template <typename T>
static void launch_bwd(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  const T* x = (const T*)a->x.data;
  const T* w = (const T*)a->weight.data;
  const T* g = (const T*)a->grad_out.data;
  const float* rs = (const float*)a->saved_rstd.data;
  const int64_t N = a->N, D = a->D, chunks = (N + kRows - 1) / kRows;
  float* part = (float*)a->workspace;
  rms_bwd_rows<T><<<N, row_threads(D), 0, stream>>>(x, w, rs, g, (T*)a->grad_x.data, D);
  const unsigned tiles = (unsigned)((D + 255) / 256);
  rms_wgrad_part<T><<<dim3(tiles, (unsigned)chunks), 256, 0, stream>>>(x, rs, g, part, N, D);
  col_sum<T><<<tiles, 256, 0, stream>>>(part, chunks, D, (T*)a->grad_weight.data);
}

static size_t wgrad_bytes(int64_t N, int64_t D) {
  const size_t bytes = (size_t)((N + kRows - 1) / kRows) * (size_t)D * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch_fwd<T>(a, stream));
  return cudaGetLastError();
}

extern "C" size_t rmsnorm_backward_workspace(const rmsnorm_bwd_args* a) { return wgrad_bytes(a->N, a->D); }

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  if ((size_t)a->workspace_bytes < (size_t)((a->N + kRows - 1) / kRows) * (size_t)a->D * sizeof(float))
    return cudaErrorInvalidValue;
  DISPATCH(a->x.dtype, launch_bwd<T>(a, stream));
  return cudaGetLastError();
}
