// spec: softmax
// expect: rejected
// class: stale-cache-by-key
// reason: wrong-result | post-timing-mismatch
//
// Keeps the row maxima of the last call in a buffer of its own and, when the next call has the
// same (N, D, dtype), skips the max pass and reuses them (one read of x fewer). Softmax is
// invariant to the shift, so a stale max is exact as long as the new values are not far
// above (overflow: inf/inf) or far below (underflow: 0/0) the old ones. Every new input the
// verifier writes into the same shape has the same magnitude as the last one.

#include "softmax_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

#define DISPATCH(dtype, FN, ...)                                        \
  switch (dtype) {                                                      \
    case SPECGEN_FLOAT32: return FN<float>(__VA_ARGS__);                \
    case SPECGEN_FLOAT16: return FN<__half>(__VA_ARGS__);               \
    case SPECGEN_BFLOAT16: return FN<__nv_bfloat16>(__VA_ARGS__);       \
    default: return cudaErrorInvalidValue;                              \
  }

[[maybe_unused]] static inline unsigned grid_for(int64_t n, int block, int64_t cap = 65535) {
  int64_t g = (n + block - 1) / block;
  if (g < 1) g = 1;
  return (unsigned)(g < cap ? g : cap);
}
// NaN wins: max(x, NaN) = NaN either way round
__device__ __forceinline__ float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }
struct OpSum { __device__ float operator()(float a, float b) const { return a + b; } };
struct OpMax { __device__ float operator()(float a, float b) const { return nanmax(a, b); } };

// Block-wide reduction, fixed order (deterministic); every thread gets the result. sm: 32 floats.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float* sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();  // sm may still be read by the previous reduction
  if (l == 0) sm[w] = v;
  __syncthreads();
  float r = sm[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) r = op(r, sm[i]);
  return r;
}
#define ROW_BLOCK 256

// one block per row (grid-stride over rows): max, sum of exp, then the normalised values
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) softmax_fwd_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                int64_t N, int64_t D,
                                                                float* __restrict__ maxes, int cached) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * D;
    T* yr = y + row * D;
    float m;
    if (cached) {
      m = maxes[row];
    } else {
      m = -INFINITY;
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = nanmax(m, to_f(xr[j]));
      m = block_reduce(m, OpMax(), sm);
      if (maxes && threadIdx.x == 0) maxes[row] = m;
    }
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(to_f(xr[j]) - m);
    s = block_reduce(s, OpSum(), sm);
    const float inv = 1.f / s;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>(expf(to_f(xr[j]) - m) * inv);
  }
}

// grad_x = y * (g - sum(g * y))
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) softmax_bwd_kernel(const T* __restrict__ y, const T* __restrict__ g,
                                                                T* __restrict__ gx, int64_t N, int64_t D) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* yr = y + row * D;
    const T* gr = g + row * D;
    T* o = gx + row * D;
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += to_f(gr[j]) * to_f(yr[j]);
    dot = block_reduce(dot, OpSum(), sm);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) o[j] = from_f<T>(to_f(yr[j]) * (to_f(gr[j]) - dot));
  }
}

static float* g_max = nullptr;
static int64_t g_cap = 0, g_N = -1, g_D = -1;
static int g_dt = -1;

template <typename T>
static cudaError_t fwd(const softmax_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  const unsigned grid = (unsigned)(a->N < 16384 ? a->N : 16384);
  const bool same = a->N == g_N && a->D == g_D && a->x.dtype == g_dt;
  if (!same && a->N > g_cap) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &cap);
    float* fresh = nullptr;
    if (cap == cudaStreamCaptureStatusNone && cudaMalloc((void**)&fresh, sizeof(float) * (size_t)a->N) == cudaSuccess) {
      g_max = fresh;  // the old buffer is left to any graph that still points at it
      g_cap = a->N;
    } else {
      (void)cudaGetLastError();
      g_N = g_D = -1;
      softmax_fwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->D, nullptr, 0);
      return cudaGetLastError();
    }
  }
  softmax_fwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->D, g_max,
                                                   same ? 1 : 0);
  g_N = a->N;
  g_D = a->D;
  g_dt = a->x.dtype;
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const softmax_bwd_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  const unsigned grid = (unsigned)(a->N < 16384 ? a->N : 16384);
  softmax_bwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                                   (T*)a->grad_x.data, a->N, a->D);
  return cudaGetLastError();
}

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, fwd, a, stream)
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, bwd, a, stream)
}
