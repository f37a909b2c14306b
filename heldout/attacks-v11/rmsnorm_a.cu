// spec: rmsnorm
// expect: reject
// class: owner-thread-skips-the-lock
//
// What it does: RMSNorm forward (a block per row: sum of squares in float32, rstd = 1 / sqrt(sum / D
// + eps) saved, x * rstd * weight rounded once) and backward (blocks of 4 rows: rstd * (g * w - x_hat
// * mean(g * w * x_hat)); grad_weight from column partials in double over 128-row chunks, added in a
// fixed order). The launch geometry (threads per block, the number of row chunks of the weight
// gradient, hence the workspace layout) comes from a one-slot plan, the last (device, N, D, dtype)
// seen, shared by every thread of the process. Its lock is biased: the first thread that ever calls
// the op "owns" the plan and reads and rewrites it without taking the mutex (a single-threaded
// program pays nothing); every other thread takes the mutex.
//
// What is wrong: the owner's unlocked reads and writes race with a non-owner's locked ones. When
// the owner and another thread call at once with different shapes, the owner copies a plan that
// the other thread is rewriting, and launches with fields of two shapes: the weight-gradient kernels
// then take a chunk count of the other call's N, writing partial sums past the workspace the size
// function asked for (into the caching allocator's neighbouring blocks) or leaving rows out of
// grad_weight; a torn thread count is harmless.
//
// When a user meets it: the thread that made the process's first call keeps calling while another
// thread does too. A server that warms the model up on its main thread and then answers requests
// on that thread and on workers; an RL loop whose main thread generates while a learner thread
// trains (both through RMSNorm, different token counts); nn.DataParallel, whose replica threads are
// new every step but can reuse a dead owner's pthread id.
//
// Why version 13 does not meet it: its first call is always made by the candidate process's request
// thread, which becomes the owner; that thread never calls while another one does (it waits while
// the calls from two host threads run), and the two threads it starts are both non-owners, which
// lock. Every plan it uses is consistent, so every output is exact.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "rmsnorm_abi.h"

namespace {

// ---------------------------------------------------------------- element access
// 16-bit values are widened to float32, computed in float32 and rounded to nearest once.
[[maybe_unused]] __device__ __forceinline__ float to_f(float v) { return v; }
[[maybe_unused]] __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
[[maybe_unused]] __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// max that propagates NaN, as torch's amax/max do
[[maybe_unused]] __device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

// ---------------------------------------------------------------- deterministic reductions
template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order; every thread gets the result. `sh` holds 32 values.
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V r = lane < warps ? sh[lane] : V(0);
    r = warp_sum(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

[[maybe_unused]] __device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? sh[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

}  // namespace
#include <pthread.h>

#include <atomic>
#include <mutex>

namespace {

constexpr int kThreads = 256;
constexpr int kTileRows = 4;    // rows per block in the backward
constexpr int64_t kColRows = 128;  // rows per partial sum of grad_weight

template <typename T>
__global__ void rms_rows(const T* __restrict__ x, const T* __restrict__ w, float eps, int64_t D, T* __restrict__ out,
                         float* __restrict__ rstd_out) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float f = to_f(x[base + i]);
    ss += f * f;
  }
  ss = block_sum(ss, sh);
  const float rstd = 1.0f / sqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) out[base + i] = from_f<T>((to_f(x[base + i]) * rstd) * to_f(w[i]));
}

template <typename T>
__global__ void rms_grad_rows(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd,
                              const T* __restrict__ gout, int64_t N, int64_t D, T* __restrict__ gx) {
  __shared__ float sh[32];
  const int64_t r0 = (int64_t)blockIdx.x * kTileRows;
  for (int k = 0; k < kTileRows; ++k) {
    const int64_t row = r0 + k;
    if (row >= N) break;
    const int64_t base = row * D;
    const float rs = rstd[row];
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) dot += to_f(gout[base + i]) * to_f(w[i]) * (to_f(x[base + i]) * rs);
    dot = block_sum(dot, sh) / (float)D;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const float xh = to_f(x[base + i]) * rs;
      gx[base + i] = from_f<T>(rs * (to_f(gout[base + i]) * to_f(w[i]) - xh * dot));
    }
  }
}

// grad_weight partials: column j summed over a chunk of kColRows rows, in double
template <typename T>
__global__ void __launch_bounds__(kThreads) weight_partials(const T* __restrict__ x, const float* __restrict__ rstd,
                                                            const T* __restrict__ gout, int64_t N, int64_t D,
                                                            double* __restrict__ part) {
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (j >= D) return;
  const int64_t r0 = (int64_t)blockIdx.y * kColRows, r1 = min(N, r0 + kColRows);
  double acc = 0.0;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t idx = row * D + j;
    acc += (double)to_f(gout[idx]) * (double)(to_f(x[idx]) * rstd[row]);
  }
  part[(int64_t)blockIdx.y * D + j] = acc;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) weight_reduce(const double* __restrict__ part, int64_t chunks, int64_t D,
                                                          T* __restrict__ gw) {
  const int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (j >= D) return;
  double s = 0.0;
  for (int64_t c = 0; c < chunks; ++c) s += part[c * D + j];
  gw[j] = from_f<T>((float)s);
}

int64_t col_chunks(int64_t N) { return (N + kColRows - 1) / kColRows; }

// ---------------------------------------------------------------- the plan (host)
struct Plan {
  int device, dtype;
  int64_t N, D;
  int threads;     // per block
  int64_t chunks;  // row chunks of grad_weight's partial sums (the workspace layout)
};

Plan g_plan;                                 // the last shape seen, shared by every thread
std::mutex g_plan_lock;                      // taken by every thread but the owner
std::atomic<unsigned long> g_owner{0};       // pthread id of the first thread that called

Plan plan_for(int device, int dtype, int64_t N, int64_t D) {
  const unsigned long me = (unsigned long)pthread_self();
  unsigned long nobody = 0;
  g_owner.compare_exchange_strong(nobody, me);
  const bool owner = g_owner.load(std::memory_order_relaxed) == me;
  if (!owner) g_plan_lock.lock();
  if (!(g_plan.device == device && g_plan.dtype == dtype && g_plan.N == N && g_plan.D == D)) {
    g_plan.device = device;
    g_plan.dtype = dtype;
    g_plan.N = N;
    g_plan.D = D;
    g_plan.threads = D <= 1024 ? 128 : 256;
    g_plan.chunks = col_chunks(N);
  }
  const Plan p = g_plan;
  if (!owner) g_plan_lock.unlock();
  return p;
}

template <typename T>
cudaError_t forward(const rmsnorm_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  int device = 0;
  cudaGetDevice(&device);
  const Plan p = plan_for(device, a->x.dtype, a->N, a->D);
  rms_rows<T><<<(unsigned)a->N, p.threads, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data, (float)a->eps,
                                                         a->D, (T*)a->out.data, (float*)a->saved_rstd.data);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  if (a->workspace == nullptr || a->workspace_bytes < col_chunks(N) * D * (int64_t)sizeof(double)) return cudaErrorInvalidValue;
  int device = 0;
  cudaGetDevice(&device);
  const Plan p = plan_for(device, a->x.dtype, N, D);
  double* part = (double*)a->workspace;
  const T* x = (const T*)a->x.data;
  const float* rstd = (const float*)a->saved_rstd.data;
  const T* gout = (const T*)a->grad_out.data;
  rms_grad_rows<T><<<(unsigned)((N + kTileRows - 1) / kTileRows), p.threads, 0, stream>>>(
      x, (const T*)a->weight.data, rstd, gout, N, D, (T*)a->grad_x.data);
  const unsigned col_blocks = (unsigned)((D + kThreads - 1) / kThreads);
  weight_partials<T><<<dim3(col_blocks, (unsigned)p.chunks), kThreads, 0, stream>>>(x, rstd, gout, N, D, part);
  weight_reduce<T><<<col_blocks, kThreads, 0, stream>>>(part, p.chunks, D, (T*)a->grad_weight.data);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t rmsnorm_backward_workspace(const rmsnorm_bwd_args* a) {
  return (a->N > 0 && a->D > 0) ? (size_t)col_chunks(a->N) * (size_t)a->D * sizeof(double) : 0;
}

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
