// spec: rmsnorm
// expect: rejected
// class: scalar-semantics
// reason: wrong-result
//
// Uses rsqrt(max(mean(x^2), eps)) instead of rsqrt(mean(x^2) + eps): identical to within
// float32 rounding whenever mean(x^2) >> eps (every normal-sized row), different when the
// row's mean square is near eps (tiny values, large eps).

#include "rmsnorm_abi.h"
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

// forward: one block per row; y = x * rsqrt(mean(x^2) + eps) * w, in fp32
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) rms_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                            T* __restrict__ y, float eps, int64_t N, int64_t D) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * D;
    T* yr = y + row * D;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float v = to_f(xr[j]); ss += v * v; }
    ss = block_reduce(ss, OpSum(), sm);
    const float r = 1.f / sqrtf(fmaxf(ss / (float)D, eps));
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>((to_f(xr[j]) * r) * to_f(w[j]));
  }
}

// backward, per row: grad_x and the row's r (kept for grad_weight)
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) rms_bwd_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                          const T* __restrict__ g, T* __restrict__ gx,
                                                          float* __restrict__ rs, float eps, int64_t N, int64_t D) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * D;
    const T* gr = g + row * D;
    T* o = gx + row * D;
    float ss = 0.f, dot = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = to_f(xr[j]);
      ss += v * v;
      dot += to_f(gr[j]) * to_f(w[j]) * v;
    }
    ss = block_reduce(ss, OpSum(), sm);
    dot = block_reduce(dot, OpSum(), sm);
    const float r = 1.f / sqrtf(ss / (float)D + eps);
    const float c = (dot * -0.5f * (r * r * r)) / (float)D;  // the order autograd uses (same NaN/Inf)
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      o[j] = from_f<T>((to_f(gr[j]) * to_f(w[j])) * r + c * (to_f(xr[j]) * 2.f));
    if (threadIdx.x == 0) rs[row] = r;
  }
}

#define RMS_CHUNK 256
// grad_weight partials: block (column tile, chunk of rows), rows summed in order
template <typename T>
__global__ void rms_bwd_cols(const T* __restrict__ x, const T* __restrict__ g, const float* __restrict__ rs,
                             float* __restrict__ part, int64_t N, int64_t D) {
  const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * RMS_CHUNK;
  if (j >= D) return;
  const int64_t r1 = r0 + RMS_CHUNK < N ? r0 + RMS_CHUNK : N;
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += to_f(g[r * D + j]) * (to_f(x[r * D + j]) * rs[r]);
  part[(int64_t)blockIdx.y * D + j] = acc;
}

template <typename T>
__global__ void rms_bwd_final(const float* __restrict__ part, T* __restrict__ gw, int64_t chunks, int64_t D) {
  const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= D) return;
  double acc = 0.0;
  for (int64_t c = 0; c < chunks; ++c) acc += (double)part[c * D + j];
  gw[j] = from_f<T>((float)acc);
}

template <typename T>
static cudaError_t fwd(const rmsnorm_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  const unsigned grid = (unsigned)(a->N < 16384 ? a->N : 16384);
  rms_fwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data, (T*)a->out.data,
                                               (float)a->eps, a->N, a->D);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const rmsnorm_bwd_args* a, cudaStream_t s) {
  const int64_t N = a->N, D = a->D;
  if (D == 0) return cudaSuccess;
  const int64_t chunks = (N + RMS_CHUNK - 1) / RMS_CHUNK;
  float* ws = nullptr;
  cudaError_t e = cudaMallocAsync((void**)&ws, sizeof(float) * (size_t)(N + (chunks > 0 ? chunks : 1) * D), s);
  if (e != cudaSuccess) return e;
  float* rs = ws;
  float* part = ws + N;
  if (N > 0) {
    const unsigned grid = (unsigned)(N < 16384 ? N : 16384);
    rms_bwd_rows<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->x.data, (const T*)a->weight.data,
                                               (const T*)a->grad_out.data, (T*)a->grad_x.data, rs, (float)a->eps, N, D);
    rms_bwd_cols<T><<<dim3((unsigned)((D + 255) / 256), (unsigned)chunks), 256, 0, s>>>(
        (const T*)a->x.data, (const T*)a->grad_out.data, rs, part, N, D);
  }
  rms_bwd_final<T><<<(unsigned)((D + 255) / 256), 256, 0, s>>>(part, (T*)a->grad_weight.data, chunks, D);
  cudaFreeAsync(ws, s);
  return cudaGetLastError();
}

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, fwd, a, stream)
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, bwd, a, stream)
}
