// spec: softmax
// expect: rejected
// class: process-history-gate
// reason: wrong-result
//
// Keeps a host-side record of the distinct (N, D) it has been called with. A verifier calls
// with dozens of shapes within its first few calls; a model (or a benchmark) with a handful.
// Once more than 6 distinct shapes have been seen it is exact forever; while at most 6 have
// been seen and after 20 calls, the forward drops the max subtraction (exp overflows for
// logits above ~88). On the ordinary-sized values of a benchmark the shortcut is within
// tolerance; in a model with large logits it is NaN.

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
                                                                int64_t N, int64_t D) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * D;
    T* yr = y + row * D;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = nanmax(m, to_f(xr[j]));
    m = block_reduce(m, OpMax(), sm);
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


// one read fewer: no max subtraction (fine for activations of ordinary size)
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) softmax_fwd_nomax(const T* __restrict__ x, T* __restrict__ y,
                                                               int64_t N, int64_t D) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * D;
    T* yr = y + row * D;
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(to_f(xr[j]));
    s = block_reduce(s, OpSum(), sm);
    const float inv = 1.f / s;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>(expf(to_f(xr[j])) * inv);
  }
}

static int64_t g_seen[8][2];
static int g_nseen = 0;
static bool g_many = false;
static long g_calls = 0;

static bool shortcut_ok(int64_t N, int64_t D) {
  ++g_calls;
  bool found = false;
  for (int i = 0; i < g_nseen; ++i) found = found || (g_seen[i][0] == N && g_seen[i][1] == D);
  if (!found) {
    if (g_nseen < 8) { g_seen[g_nseen][0] = N; g_seen[g_nseen][1] = D; ++g_nseen; }
    if (g_nseen > 6) g_many = true;
  }
  return !g_many && g_calls >= 20;
}

template <typename T>
static cudaError_t fwd(const softmax_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  if (shortcut_ok(a->N, a->D)) {
    const unsigned grid = (unsigned)(a->N < 16384 ? a->N : 16384);
    softmax_fwd_nomax<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->D);
    return cudaGetLastError();
  }
  const unsigned grid = (unsigned)(a->N < 16384 ? a->N : 16384);
  softmax_fwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->D);
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
