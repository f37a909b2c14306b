// rmsnorm: a correct hand-written kernel (forward and backward), for the verifier's tests.
// One block per row; float accumulation; fixed-order reductions, so results are
// bit-identical run to run. grad_weight is reduced over rows by one thread per column (Kahan-compensated).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "rmsnorm_abi.h"

#define DISPATCH(code, ...)                                                              \
  switch (code) {                                                                        \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; break; }                       \
    case SPECGEN_FLOAT16: { typedef __half T; __VA_ARGS__; break; }                      \
    case SPECGEN_BFLOAT16: { typedef __nv_bfloat16 T; __VA_ARGS__; break; }              \
    default: return cudaErrorInvalidValue;                                               \
  }

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

constexpr int kThreads = 256;

// Sum over the block; every thread gets the total. Fixed order: deterministic.
__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `partial` may still be read from a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  return total;
}

template <typename T>
__global__ void rms_fwd(const T* x, const T* w, T* y, int64_t D, float eps) {
  const T* row = x + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += kThreads) { float v = load(row, j); ss += v * v; }
  float rstd = rsqrtf(block_sum(ss) / (float)D + eps);
  for (int64_t j = threadIdx.x; j < D; j += kThreads)
    store(y + blockIdx.x * D, j, load(row, j) * rstd * load(w, j));
}

template <typename T>
__global__ void rms_bwd_x(const T* x, const T* w, const T* g, T* dx, float* rstd_out, int64_t D, float eps) {
  const T* row = x + blockIdx.x * D;
  const T* grow = g + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += kThreads) { float v = load(row, j); ss += v * v; }
  float rstd = rsqrtf(block_sum(ss) / (float)D + eps);
  float dot = 0.f;  // sum_j g_j w_j xhat_j
  for (int64_t j = threadIdx.x; j < D; j += kThreads) dot += load(grow, j) * load(w, j) * load(row, j) * rstd;
  float mean_dot = block_sum(dot) / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += kThreads) {
    float xhat = load(row, j) * rstd;
    store(dx + blockIdx.x * D, j, rstd * (load(grow, j) * load(w, j) - xhat * mean_dot));
  }
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
}

template <typename T>
__global__ void rms_bwd_w(const T* x, const T* g, const float* rstd, T* dw, int64_t N, int64_t D) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  // Compensated (Kahan) sum in row order: a plain float sum over N = 16384 rows errs by ~N eps,
  // above an fp32 tolerance of 1e-5; the compensation keeps it near 2 eps and deterministic.
  float acc = 0.f, carry = 0.f;
  for (int64_t n = 0; n < N; ++n) {
    float term = load(g, n * D + j) * load(x, n * D + j) * rstd[n] - carry;
    float next = acc + term;
    carry = (next - acc) - term;
    acc = next;
  }
  store(dw, j, acc);
}

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, rms_fwd<T><<<(unsigned)a->N, kThreads, 0, stream>>>(
      (const T*)a->x.data, (const T*)a->weight.data, (T*)a->out.data, a->D, (float)a->eps));
  return cudaGetLastError();
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  float* rstd = nullptr;
  cudaError_t err = cudaMallocAsync((void**)&rstd, a->N * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  DISPATCH(a->x.dtype,
           rms_bwd_x<T><<<(unsigned)a->N, kThreads, 0, stream>>>(
               (const T*)a->x.data, (const T*)a->weight.data, (const T*)a->grad_out.data, (T*)a->grad_x.data,
               rstd, a->D, (float)a->eps);
           rms_bwd_w<T><<<(unsigned)((a->D + 255) / 256), 256, 0, stream>>>(
               (const T*)a->x.data, (const T*)a->grad_out.data, rstd, (T*)a->grad_weight.data, a->N, a->D));
  err = cudaGetLastError();
  cudaFreeAsync(rstd, stream);
  return err;
}
