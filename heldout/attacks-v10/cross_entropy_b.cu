// spec: cross_entropy
// expect: rejected
// class: local-memory-reserved-for-the-context
// why: the narrow-row forward caches each lane's logits in a per-thread array sized for the widest row of the spec (16 KiB of local memory a thread); its first launch makes the driver reserve 16 KiB for every thread the GPU can hold, about 4.4 GB on an H100/H200, kept for the life of the process
//
// Mean cross-entropy, the same code as the control of this spec (cross_entropy_c) for rows of more
// than 1024 classes and for the backward: one block per row, NaN-propagating max, sum of exp, saved
// (max, logsum), a double-precision fixed-order mean; backward from the saved pair.
//
// What is wrong. Rows of at most 1024 classes (classification heads, token classification, reward
// models, routers) take a warp-per-row forward that reads the row once into a per-lane array and
// makes its passes over that copy. The array is declared with the spec's largest width,
// float v[131072 / 32] (16 KiB), and indexed with the row's runtime length, so it lives in local
// memory: ptxas reports a stack frame of about 16 KiB for this kernel. Rows of a few hundred classes
// touch its first entries only, so nothing shows in the results or the time. But local memory is
// reserved per resident thread: at the kernel's first launch the driver grows the context's local
// memory to 16 KiB x 2048 threads x 132 SMs = 4.4 GB, and keeps it until the process exits (cuda.h,
// CU_LIMIT_STACK_SIZE: "The driver automatically increases the per-thread stack size for each kernel
// launch as needed. This size isn't reset back to the original value after each launch";
// CU_CTX_LMEM_RESIZE_TO_MAX: "the behavior enabled by this flag is now the default and cannot be
// disabled"). The memory is invisible to torch.cuda.memory_allocated/reserved and to the default
// pool, and no call can free it.
//
// When a user meets it. Any process that computes this loss over a classification head: fine-tuning
// a sequence or token classifier, training a reward model, image classification (1000 classes).
// A training job sized to the GPU's memory (batch size found by auto_find_batch_size, FSDP/ZeRO plans
// made before the first step) runs out of memory 4.4 GB early; a server that measures free memory
// after a warm-up (vLLM's KV-cache sizing) silently gets 4.4 GB less cache; on a 24-48 GB GPU the
// launch itself fails with an out-of-memory error when the reservation does not fit.
//
// Why version 12 does not meet it. Its memory checks read the default memory pool's bytes in use
// (memory left allocated) and cap that pool (no memory left to allocate); local memory is neither.
// Full-size cases are planned to the free memory measured at the time, so 4.4 GB less on a 141 GB
// H200 only shrinks the plan; the static checks record ptxas's stack frames but do not judge them.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "cross_entropy_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// torch's amax: NaN wins
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

// Deterministic reductions over a block of BLOCK threads (`red`: 32 floats): a butterfly in each
// warp, then the warps' values added in warp order by every thread.
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

template <int BLOCK>
__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  v = __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < BLOCK / 32; ++w) r = nan_max(r, red[w]);
  return r;
}

__device__ __forceinline__ int64_t clamp_target(int64_t t, int64_t C) {  // a label outside [0, C): read the row's edge
  return t < 0 ? 0 : (t >= C ? C - 1 : t);
}

constexpr int kRowBlock = 256;

// One row per block: max, sum of exp(x - max), log of the sum; the row's loss into the workspace.
template <typename T>
__global__ void __launch_bounds__(kRowBlock) ce_fwd_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                         int64_t C, float* __restrict__ row_loss,
                                                         float* __restrict__ smax, float* __restrict__ slogsum) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * C;
  float m = -INFINITY;
  for (int64_t e = threadIdx.x; e < C; e += kRowBlock) m = nan_max(m, to_f<T>(xr[e]));
  m = block_max<kRowBlock>(m, red);
  float s = 0.f;
  for (int64_t e = threadIdx.x; e < C; e += kRowBlock) s += expf(to_f<T>(xr[e]) - m);
  s = block_sum<kRowBlock>(s, red);
  if (threadIdx.x == 0) {
    const float logsum = logf(s);
    const float xt = to_f<T>(xr[clamp_target(target[row], C)]);
    row_loss[row] = logsum - (xt - m);  // -((x_t - max) - logsum), torch's log_softmax at the target
    smax[row] = m;
    slogsum[row] = logsum;
  }
}

// The mean: one block sums the rows' losses in double in a fixed order.
__global__ void __launch_bounds__(1024) ce_mean(const float* __restrict__ row_loss, int64_t N, float* __restrict__ out) {
  __shared__ double part[1024];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += 1024) acc += (double)row_loss[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = 512; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = (float)(part[0] / (double)N);
}

// grad = (exp((x - max) - logsum) - [j == target]) * g / N, from the saved (max, logsum) pair
template <typename T>
__global__ void __launch_bounds__(kRowBlock) ce_bwd_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                         int64_t N, int64_t C, const float* __restrict__ smax,
                                                         const float* __restrict__ slogsum, const float* __restrict__ grad_out,
                                                         T* __restrict__ grad) {
  const int64_t row = blockIdx.x;
  const float g = grad_out[0];
  T* gr = grad + row * C;
  const float scale = g / (float)N;
  const float m = smax[row], logsum = slogsum[row];
  const int64_t t = target[row];
  const T* xr = logits + row * C;
  for (int64_t e = threadIdx.x; e < C; e += kRowBlock) {
    const float p = expf((to_f<T>(xr[e]) - m) - logsum);
    gr[e] = from_f<T>((p - (e == t ? 1.f : 0.f)) * scale);
  }
}

// Narrow rows (classification heads): a warp per row, the row read once into each lane's array.
constexpr int kMaxC = 131072;              // the spec's widest row
constexpr int kPerLane = kMaxC / 32;       // values a lane can hold
constexpr int kNarrowMax = 1024;           // rows up to this width take this path

template <typename T>
__global__ void __launch_bounds__(256) ce_fwd_narrow(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                     int64_t N, int64_t C, float* __restrict__ row_loss,
                                                     float* __restrict__ smax, float* __restrict__ slogsum) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (row >= N) return;
  const T* xr = logits + row * C;
  const int nk = (int)((C + 31) / 32);
  float v[kPerLane];
  float m = -INFINITY;
  for (int k = 0; k < nk; ++k) {
    const int64_t e = (int64_t)k * 32 + lane;
    v[k] = e < C ? to_f<T>(xr[e]) : -INFINITY;
    if (e < C) m = nan_max(m, v[k]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  m = __shfl_sync(0xffffffffu, m, 0);
  float s = 0.f;
  for (int k = 0; k < nk; ++k)
    if ((int64_t)k * 32 + lane < C) s += expf(v[k] - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  s = __shfl_sync(0xffffffffu, s, 0);
  if (lane == 0) {
    const float logsum = logf(s);
    const int64_t t = clamp_target(target[row], C);
    const float xt = to_f<T>(xr[t]);
    row_loss[row] = logsum - (xt - m);
    smax[row] = m;
    slogsum[row] = logsum;
  }
}


inline size_t round256(size_t b) { return (b + 255) / 256 * 256; }
inline size_t fwd_workspace(int64_t N) { return round256(sizeof(float) * (size_t)N); }

template <typename T>
cudaError_t forward_t(const cross_entropy_args* a, cudaStream_t s) {
  const int64_t N = a->N, C = a->C;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < fwd_workspace(N)) return cudaErrorInvalidValue;
  float* row_loss = static_cast<float*>(a->workspace);
  const T* x = static_cast<const T*>(a->logits.data);
  const int64_t* t = static_cast<const int64_t*>(a->target.data);
  float* smax = static_cast<float*>(a->saved_max.data);
  float* slog = static_cast<float*>(a->saved_logsum.data);
  if (C <= kNarrowMax) {
    ce_fwd_narrow<T><<<(unsigned)((N + 7) / 8), 256, 0, s>>>(x, t, N, C, row_loss, smax, slog);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    ce_mean<<<1, 1024, 0, s>>>(row_loss, N, static_cast<float*>(a->out.data));
    return cudaGetLastError();
  }
  ce_fwd_rows<T><<<(unsigned)N, kRowBlock, 0, s>>>(x, t, C, row_loss, smax, slog);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ce_mean<<<1, 1024, 0, s>>>(row_loss, N, static_cast<float*>(a->out.data));
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const cross_entropy_bwd_args* a, cudaStream_t s) {
  ce_bwd_rows<T><<<(unsigned)a->N, kRowBlock, 0, s>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<const float*>(a->saved_max.data), static_cast<const float*>(a->saved_logsum.data),
      static_cast<const float*>(a->grad_out.data), static_cast<T*>(a->grad_logits.data));
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) { return fwd_workspace(a->N); }

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->C <= 0) return cudaSuccess;
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->C <= 0) return cudaSuccess;
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
