// spec: layernorm_gelu
// expect: rejected
// class: device-ordinal-zero-assumed
// why: the backward takes its scratch from the default memory pool of device 0, whatever device the call runs on: on any other device the kernels touch memory their device cannot access
//
// LayerNorm over the last dim with affine weight and bias, then GELU (tanh approximation), float32
// math. Forward: one block of 256 threads per row, two-pass statistics in double (mean, then the mean
// of (x - mean)^2), y = (x - mean) * rstd * w + b rounded to
// the dtype as F.layer_norm returns it, then torch's tanh-GELU formula on it, rounded once. Backward:
// gy = gelu'(y) * g rounded to the dtype (torch's gelu_backward), then per row
// grad_x = rstd * (w*gy - mean(w*gy) - xhat * mean(w*gy*xhat)); grad_weight = sum(gy * xhat) and
// grad_bias = sum(gy) over rows in two fixed-order levels (64-row chunks in double, then the chunks in
// double) through a scratch buffer with the rows' statistics.
//
// What is wrong. The scratch (rows' statistics and the chunks' partial sums, 16 N + 16 D ceil(N / 64)
// bytes) comes from cudaMallocFromPoolAsync on the default memory pool of device 0 --
// cudaDeviceGetDefaultMemPool(&pool, 0), a literal 0 where the call's device belongs (the package's
// binding keeps that pool's freed memory, and allocating from the default pool by name keeps the
// scratch out of whatever pool another library made current). cudaMallocFromPoolAsync accepts a pool
// of another device ("the specified memory pool may be from a device different than that of the
// specified stream") and hands back device 0's memory; a pool's allocations are accessible only from
// its own device unless cudaMemPoolSetAccess grants more, which nothing here does. On device 0 all is
// exact; on any other device the backward's kernels read and write memory their GPU cannot map:
// an illegal memory access, and the CUDA context of the process is lost.
//
// When a user meets it. Any backward on a GPU other than ordinal 0 of the process: DDP/FSDP through
// torchrun, where every rank sees all the node's GPUs and selects cuda:<local_rank> (ranks 1..7 die at
// their first backward), the Hugging Face Trainer/Accelerate on multi-GPU nodes, a single-GPU job told
// to use cuda:1 on a shared workstation, nn.DataParallel replicas, device_map="auto" fine-tuning.
// The forward is fine everywhere, so inference and evaluation work and the failure waits for training.
//
// Why version 12 does not meet it. Every case runs on the candidate process's device 0 (a one-GPU
// machine, or the first of several: candidate_main uses torch.cuda.current_device()), where device 0's
// pool is the right one. The memory left allocated is measured in that very pool (the scratch is
// freed at the end of every call); the call with no memory left caps the device's *current* pool, which
// an allocation from the default pool by name does not use, so the call succeeds and is exact.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "layernorm_gelu_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <int BLOCK>
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  v = __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.f;
#pragma unroll
  for (int w = 0; w < BLOCK / 32; ++w) r += red[w];
  return r;
}


// torch's tanh-GELU (GeluCUDAKernelImpl, approximate="tanh") and its backward, in float
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2) * 2/sqrt(pi) * 0.5
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu_f(float x) {
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return 0.5f * x * (1.f + tanhf(inner));
}

__device__ __forceinline__ float gelu_grad_f(float dy, float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.f - tanh_inner * tanh_inner;
  const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

constexpr int kBlock = 256;

// Deterministic block sum in double (the row statistics: at uncentred rows a float32 mean is off by
// more than the answer's tolerance once the weight scales the deviation up).
__device__ __forceinline__ double block_sum_d(double v, double* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  v = __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
#pragma unroll
  for (int w = 0; w < kBlock / 32; ++w) r += red[w];
  return r;
}

// mean (kept in double) and rstd of a row, two passes
template <typename T>
__device__ __forceinline__ void row_stats(const T* xr, int64_t D, float eps, double* red, double& mean, float& rstd) {
  double s = 0.0;
  for (int64_t e = threadIdx.x; e < D; e += kBlock) s += (double)to_f<T>(xr[e]);
  s = block_sum_d(s, red);
  mean = s / (double)D;
  double q = 0.0;
  for (int64_t e = threadIdx.x; e < D; e += kBlock) {
    const double d = (double)to_f<T>(xr[e]) - mean;
    q += d * d;
  }
  q = block_sum_d(q, red);
  rstd = rsqrtf((float)(q / (double)D) + eps);
}

// the normalized value: the deviation from the double mean, rounded once to float32, times rstd
template <typename T>
__device__ __forceinline__ float xhat(T x, double mean, float rstd) {
  return (float)((double)to_f<T>(x) - mean) * rstd;
}

template <typename T>
__global__ void __launch_bounds__(kBlock) lng_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                                  T* __restrict__ out, int64_t D, float eps) {
  __shared__ double redd[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  double mean;
  float rstd;
  row_stats<T>(xr, D, eps, redd, mean, rstd);
  for (int64_t e = threadIdx.x; e < D; e += kBlock) {
    const float y = to_f<T>(from_f<T>(xhat<T>(xr[e], mean, rstd) * to_f<T>(w[e]) + to_f<T>(b[e])));
    out[row * D + e] = from_f<T>(gelu_f(y));
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock) lng_bwd_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                       const T* __restrict__ b, const T* __restrict__ g,
                                                       T* __restrict__ gx, double2* __restrict__ stats, int64_t D, float eps) {
  __shared__ float red[32];
  __shared__ double redd[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  const T* gr = g + row * D;
  double mean;
  float rstd;
  row_stats<T>(xr, D, eps, redd, mean, rstd);
  if (threadIdx.x == 0) stats[row] = make_double2(mean, (double)rstd);
  float st = 0.f, stx = 0.f;
  for (int64_t e = threadIdx.x; e < D; e += kBlock) {
    const float xh = xhat<T>(xr[e], mean, rstd);
    const float y = to_f<T>(from_f<T>(xh * to_f<T>(w[e]) + to_f<T>(b[e])));
    const float gy = to_f<T>(from_f<T>(gelu_grad_f(to_f<T>(gr[e]), y)));
    const float t = to_f<T>(w[e]) * gy;
    st += t;
    stx += t * xh;
  }
  st = block_sum<kBlock>(st, red);
  stx = block_sum<kBlock>(stx, red);
  const float mt = st / (float)D, mtx = stx / (float)D;
  for (int64_t e = threadIdx.x; e < D; e += kBlock) {
    const float xh = xhat<T>(xr[e], mean, rstd);
    const float y = to_f<T>(from_f<T>(xh * to_f<T>(w[e]) + to_f<T>(b[e])));
    const float gy = to_f<T>(from_f<T>(gelu_grad_f(to_f<T>(gr[e]), y)));
    const float t = to_f<T>(w[e]) * gy;
    gx[row * D + e] = from_f<T>(rstd * ((t - mt) - xh * mtx));
  }
}

constexpr int64_t kRowsPerChunk = 64;

template <typename T>
__global__ void __launch_bounds__(256) lng_wgrad_chunks(const T* __restrict__ x, const T* __restrict__ w,
                                                        const T* __restrict__ b, const T* __restrict__ g,
                                                        const double2* __restrict__ stats, int64_t N, int64_t D,
                                                        double* __restrict__ part) {
  const int64_t col = (int64_t)blockIdx.x * 256 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= D) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  const float wv = to_f<T>(w[col]), bv = to_f<T>(b[col]);
  double aw = 0.0, ab = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    const double2 st = stats[r];
    const float xh = xhat<T>(x[r * D + col], st.x, (float)st.y);
    const float y = to_f<T>(from_f<T>(xh * wv + bv));
    const float gy = to_f<T>(from_f<T>(gelu_grad_f(to_f<T>(g[r * D + col]), y)));
    aw += (double)(gy * xh);
    ab += (double)gy;
  }
  part[(chunk * 2) * D + col] = aw;
  part[(chunk * 2 + 1) * D + col] = ab;
}

template <typename T>
__global__ void __launch_bounds__(256) lng_wgrad_final(const double* __restrict__ part, int64_t nchunks, int64_t D,
                                                       T* __restrict__ gw, T* __restrict__ gb) {
  const int64_t col = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (col >= D) return;
  double aw = 0.0, ab = 0.0;
  for (int64_t c = 0; c < nchunks; ++c) {
    aw += part[(c * 2) * D + col];
    ab += part[(c * 2 + 1) * D + col];
  }
  gw[col] = from_f<T>((float)aw);
  gb[col] = from_f<T>((float)ab);
}

// Scratch from the device's default pool, whose freed memory the package's binding keeps (a call
// then maps nothing), named explicitly so that a pool another library made current is not used.
cudaError_t scratch_alloc(void** p, size_t bytes, cudaStream_t s) {
  cudaMemPool_t pool;
  cudaError_t err = cudaDeviceGetDefaultMemPool(&pool, 0);
  if (err != cudaSuccess) return err;
  return cudaMallocFromPoolAsync(p, bytes, pool, s);
}

template <typename T>
cudaError_t forward_t(const layernorm_gelu_args* a, cudaStream_t s) {
  lng_fwd<T><<<(unsigned)a->N, kBlock, 0, s>>>(static_cast<const T*>(a->x.data), static_cast<const T*>(a->weight.data),
                                              static_cast<const T*>(a->bias.data), static_cast<T*>(a->out.data),
                                              a->D, (float)a->eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const layernorm_gelu_bwd_args* a, cudaStream_t s) {
  const int64_t N = a->N, D = a->D;
  const int64_t nch = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  const size_t stats_bytes = ((sizeof(double2) * (size_t)N + 255) / 256) * 256;
  void* scratch = nullptr;
  cudaError_t err = scratch_alloc(&scratch, stats_bytes + sizeof(double) * 2 * (size_t)(nch * D), s);
  if (err != cudaSuccess) return err;
  double2* stats = static_cast<double2*>(scratch);
  double* part = reinterpret_cast<double*>(static_cast<char*>(scratch) + stats_bytes);
  const T* x = static_cast<const T*>(a->x.data);
  const T* w = static_cast<const T*>(a->weight.data);
  const T* b = static_cast<const T*>(a->bias.data);
  const T* g = static_cast<const T*>(a->grad_out.data);
  lng_bwd_rows<T><<<(unsigned)N, kBlock, 0, s>>>(x, w, b, g, static_cast<T*>(a->grad_x.data), stats, D, (float)a->eps);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    lng_wgrad_chunks<T><<<dim3((unsigned)((D + 255) / 256), (unsigned)nch), 256, 0, s>>>(x, w, b, g, stats, N, D, part);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    lng_wgrad_final<T><<<(unsigned)((D + 255) / 256), 256, 0, s>>>(part, nch, D, static_cast<T*>(a->grad_weight.data),
                                                                  static_cast<T*>(a->grad_bias.data));
    err = cudaGetLastError();
  }
  const cudaError_t freed = cudaFreeAsync(scratch, s);
  return err != cudaSuccess ? err : freed;
}

}  // namespace

extern "C" cudaError_t layernorm_gelu_forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t layernorm_gelu_backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
