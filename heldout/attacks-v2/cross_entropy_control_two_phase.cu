// spec: cross_entropy
// expect: passed
// class: control-two-phase-deterministic
// reason: passed
//
// control: must pass. Per-row losses into a stream-ordered workspace, then one block sums them
// in a fixed order in double; the backward recomputes each row's max and sum.

#include "cross_entropy_abi.h"
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

// per row: loss_i = logsumexp(x_i) - x_i[t_i], the max subtracted first
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) ce_rows(const T* __restrict__ x, const int64_t* __restrict__ t,
                                                     float* __restrict__ loss, int64_t N, int64_t C) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = nanmax(m, to_f(xr[j]));
    m = block_reduce(m, OpMax(), sm);
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(to_f(xr[j]) - m);
    s = block_reduce(s, OpSum(), sm);
    if (threadIdx.x == 0) loss[row] = -((to_f(xr[t[row]]) - m) - logf(s));
  }
}

// the mean over rows: one block, fixed order, in double
__global__ void __launch_bounds__(1024) ce_mean(const float* __restrict__ loss, float* __restrict__ out, int64_t N) {
  __shared__ double sm[1024];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += (double)loss[i];
  sm[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) sm[threadIdx.x] += sm[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = (float)(sm[0] / (double)N);
}

// grad_logits = grad * (softmax - onehot) / N
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) ce_bwd(const T* __restrict__ x, const int64_t* __restrict__ t,
                                                    const float* __restrict__ go, T* __restrict__ gx,
                                                    int64_t N, int64_t C) {
  __shared__ float sm[32];
  const float k = *go / (float)N;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;
    T* o = gx + row * C;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = nanmax(m, to_f(xr[j]));
    m = block_reduce(m, OpMax(), sm);
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(to_f(xr[j]) - m);
    s = block_reduce(s, OpSum(), sm);
    const float ls = logf(s);
    const int64_t tr = t[row];
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
      o[j] = from_f<T>(expf((to_f(xr[j]) - m) - ls) * k - (j == tr ? k : 0.f));
  }
}

template <typename T>
static cudaError_t fwd(const cross_entropy_args* a, cudaStream_t s) {
  const int64_t N = a->N, C = a->C;
  if (N == 0 || C == 0) return cudaSuccess;
  float* loss = nullptr;
  cudaError_t e = cudaMallocAsync((void**)&loss, sizeof(float) * (size_t)N, s);
  if (e != cudaSuccess) return e;
  const unsigned grid = (unsigned)(N < 16384 ? N : 16384);
  ce_rows<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->logits.data, (const int64_t*)a->target.data, loss, N, C);
  ce_mean<<<1, 1024, 0, s>>>(loss, (float*)a->out.data, N);
  cudaFreeAsync(loss, s);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const cross_entropy_bwd_args* a, cudaStream_t s) {
  const int64_t N = a->N, C = a->C;
  if (N == 0 || C == 0) return cudaSuccess;
  const unsigned grid = (unsigned)(N < 16384 ? N : 16384);
  ce_bwd<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->logits.data, (const int64_t*)a->target.data,
                                       (const float*)a->grad_out.data, (T*)a->grad_logits.data, N, C);
  return cudaGetLastError();
}

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  DISPATCH(a->logits.dtype, fwd, a, stream)
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->logits.dtype, bwd, a, stream)
}
