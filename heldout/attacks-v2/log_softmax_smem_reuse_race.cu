// spec: log_softmax
// expect: rejected
// class: shared-memory-race
// reason: nondeterministic | wrong-result
//
// The block reduction reuses its 32 shared slots for the next reduction without the barrier
// that keeps a fast warp from overwriting a slot a slow warp has not read yet (the max's
// partials, then the sum's, then the next row's max). Correct whenever the warps stay roughly
// in step; wrong when one warp falls a pass behind (under load).

#include "log_softmax_abi.h"
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
  if (l == 0) sm[w] = v;
  __syncthreads();
  float r = sm[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) r = op(r, sm[i]);
  return r;
}
#define ROW_BLOCK 256

// one block per row (grid-stride over rows): y = x - max - log(sum exp(x - max))
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) lsm_fwd_kernel(const T* __restrict__ x, T* __restrict__ y,
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
    const float ls = logf(s);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>((to_f(xr[j]) - m) - ls);
  }
}

// grad_x = g - exp(y) * sum(g)
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) lsm_bwd_kernel(const T* __restrict__ y, const T* __restrict__ g,
                                                            T* __restrict__ gx, int64_t N, int64_t D) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* yr = y + row * D;
    const T* gr = g + row * D;
    T* o = gx + row * D;
    float sg = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sg += to_f(gr[j]);
    sg = block_reduce(sg, OpSum(), sm);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) o[j] = from_f<T>(to_f(gr[j]) - expf(to_f(yr[j])) * sg);
  }
}

template <typename T>
static cudaError_t fwd(const log_softmax_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  const unsigned grid = (unsigned)(a->N < 16384 ? a->N : 16384);
  lsm_fwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->D);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const log_softmax_bwd_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  const unsigned grid = (unsigned)(a->N < 16384 ? a->N : 16384);
  lsm_bwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                               (T*)a->grad_x.data, a->N, a->D);
  return cudaGetLastError();
}

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, fwd, a, stream)
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, bwd, a, stream)
}
