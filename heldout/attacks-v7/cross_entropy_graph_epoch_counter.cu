// spec: cross_entropy
// expect: rejected
// class: graph-replay-workspace-state
// reason: wrong-result, unwritten-output, not-capturable
//
// A cross-entropy whose mean is finished by "the last block done", with a self-resetting counter in
// the workspace tagged by a per-call epoch that the host passes as a kernel argument.
//
// What it does: the device code is the control's (cross_entropy_control.cu) except the mean. Each
// forward block writes its rows' loss sum to its workspace slot, fences, and bumps a 64-bit counter
// word in the workspace: (epoch << 24 | count). A block that finds another epoch in the word starts it
// at (epoch << 24 | 1) (so garbage left in the workspace needs no memset); the block that brings the
// count to gridDim.x adds the slots in a fixed order and writes the mean. The epoch is a host counter,
// incremented atomically on every call (40 bits), so two eager calls never share one.
//
// Wrong when: the call is captured in a CUDA graph and the graph is replayed more than once, with
// nothing else in the graph writing over the workspace's counter word between replays (the loss
// captured once per graph, late in it: a graphed loss callable, a captured forward that ends with the
// loss, a graphed training step where no later allocation of the capture reuses that block).
// The captured kernel keeps the epoch it was captured with, and the graph's workspace keeps what the
// previous replay left: (epoch << 24 | G). Every block of the next replay then counts past G, no block
// is "last", and `out` is never written: the loss stays at the first replay's value, forever
// (saved_max and saved_logsum, hence the gradients, stay right). Eager calls are always exact.
//
// Why the verifier misses it: the judge fills the workspace with random bytes before every call,
// capture and replay (isolation.scramble_workspace), so a replay never finds the previous replay's
// counter; the package's graph replays get the graph pool's memory as the last replay left it. The
// endurance run, which does not refill it, replays 1000 captured calls with 1000 epochs, whose words
// never match the next call's (and its outputs are not checked).

#include "cross_entropy_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined in every file)
namespace hv7 {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A max that propagates NaN, as torch's amax does.
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// Block reductions (blockDim.x a multiple of 32, at most 1024): warp trees, then every thread adds
// the warps' values in warp order, so the result is the same bits on every call and every thread
// has it. `sh` is 32 entries of shared memory; the leading barrier lets a reduction follow another.
__device__ __forceinline__ double block_sum(double v, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int i = 0; i < warps; ++i) r += sh[i];
  return r;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int i = 0; i < warps; ++i) r = nan_max(r, sh[i]);
  return r;
}

}  // namespace hv7

namespace hv7 {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // forward grid cap: one workspace slot per block
constexpr unsigned long long kEpochMask = (1ull << 40) - 1;

unsigned long long g_epoch = 0;  // calls so far (host), the epoch of the next call's counter

template <typename T>
__global__ void __launch_bounds__(kThreads)
ce_forward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t N, int64_t C,
                float* __restrict__ saved_max, float* __restrict__ saved_logsum, double* partial,
                unsigned long long* counter, unsigned long long epoch, float* __restrict__ out) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ int last;
  double acc = 0.0;  // thread 0's copy: this block's rows' losses, in row order
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * C;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = nan_max(m, to_f(row[j]));
    m = block_max(m, shf);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += (double)expf(to_f(row[j]) - m);
    s = block_sum(s, shd);
    if (threadIdx.x == 0) {
      saved_max[n] = m;
      saved_logsum[n] = (float)log(s);
      const int64_t t = target[n];
      acc += ((double)m - (double)to_f(row[t])) + log(s);
    }
  }
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = acc;
    __threadfence();  // the slot before the count
    unsigned long long seen = atomicAdd(counter, 0ull), next;
    for (;;) {
      next = ((seen >> 24) == epoch) ? seen + 1ull : ((epoch << 24) | 1ull);
      const unsigned long long prev = atomicCAS(counter, seen, next);
      if (prev == seen) break;
      seen = prev;
    }
    last = (next & 0xFFFFFFull) == (unsigned long long)gridDim.x;
  }
  __syncthreads();
  if (last) {
    __threadfence();
    double v = 0.0;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += blockDim.x) v += ((volatile double*)partial)[i];
    v = block_sum(v, shd);
    if (threadIdx.x == 0) out[0] = (float)(v / (double)N);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
ce_backward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t N, int64_t C,
                 const float* __restrict__ saved_max, const float* __restrict__ saved_logsum,
                 const float* __restrict__ grad_out, T* __restrict__ grad) {
  const float g = grad_out[0] / (float)N;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float m = saved_max[n], ls = saved_logsum[n];
    const int64_t t = target[n];
    const T* row = logits + n * C;
    T* grow = grad + n * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const float p = expf((to_f(row[j]) - m) - ls);
      float v = g * p;
      if (j == t) v -= g;
      grow[j] = from_f<T>(v);
    }
  }
}

template <typename T>
void launch_forward(const cross_entropy_args* a, int G, unsigned long long epoch, cudaStream_t stream) {
  double* partial = static_cast<double*>(a->workspace);
  unsigned long long* counter = reinterpret_cast<unsigned long long*>(partial + kMaxBlocks);
  ce_forward_rows<T><<<G, kThreads, 0, stream>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<float*>(a->saved_max.data), static_cast<float*>(a->saved_logsum.data), partial, counter,
      epoch, static_cast<float*>(a->out.data));
}

template <typename T>
void launch_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  const int64_t blocks = a->N < 8192 ? a->N : 8192;
  ce_backward_rows<T><<<(unsigned)blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<const float*>(a->saved_max.data), static_cast<const float*>(a->saved_logsum.data),
      static_cast<const float*>(a->grad_out.data), static_cast<T*>(a->grad_logits.data));
}

}  // namespace hv7

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) {
  (void)a;
  return (size_t)hv7::kMaxBlocks * sizeof(double) + 256;  // the slots, then the counter word
}

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  using namespace hv7;
  const int G = (int)(a->N < kMaxBlocks ? a->N : kMaxBlocks);
  const unsigned long long epoch = __atomic_add_fetch(&g_epoch, 1ull, __ATOMIC_RELAXED) & kEpochMask;
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: launch_forward<float>(a, G, epoch, stream); break;
    case SPECGEN_FLOAT16: launch_forward<__half>(a, G, epoch, stream); break;
    case SPECGEN_BFLOAT16: launch_forward<__nv_bfloat16>(a, G, epoch, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  using namespace hv7;
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: launch_backward<float>(a, stream); break;
    case SPECGEN_FLOAT16: launch_backward<__half>(a, stream); break;
    case SPECGEN_BFLOAT16: launch_backward<__nv_bfloat16>(a, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
