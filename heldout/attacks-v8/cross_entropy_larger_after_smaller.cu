// spec: cross_entropy
// expect: rejected
// class: workspace-left-by-a-smaller-call
// reason: wrong-result, unwritten-output
//
// A cross-entropy that skips zeroing its counters when its workspace says a previous call left them
// clean, though that call cleaned only the counters of its own rows.
//
// What it does: cross_entropy_control.cu's kernels (each row cut into 4096-column chunks, one block
// per chunk; per-row arrival counters and a call-wide row counter in the workspace; the finishing
// blocks put their counters back to zero), with one change: the call's last block writes a 64-bit
// "clean" word at the workspace's start, and the zeroing kernel at the start of a call does nothing
// when it finds that word ("the last call left the counters at zero: save a launch's worth of
// writes"). Counters sit at a fixed offset (256 bytes), the rows' losses and the chunks' partials
// after them, at offsets that grow with N.
//
// Wrong when: the workspace a call gets was last used by a call of this kernel with fewer rows (a
// larger batch after a smaller one, the next sequence-length bucket up, evaluation at a larger batch
// than training, a chunked loss whose chunks grow): the "clean" word is there, the counters of rows
// past the earlier call's N were never zeroed and hold that call's row losses and partials (or
// whatever else was there). Those rows' arrival counts never reach their chunk count, or reach it
// early: their saved_max and saved_logsum are not written or are merged from missing chunks, the row
// counter never reaches N, and the loss is not written at all (the tensor keeps what the allocator
// left in it, often the previous step's loss). PyTorch's caching allocator hands the same block back
// for a larger request whenever the freed block and its free neighbours cover it. Calls with the same
// or fewer rows on a kept workspace are exact.
//
// Why the verifier misses it: it fills the workspace with random bytes before nearly every call; it
// keeps the workspace only for graph replays (the same N), the endurance run (the same N) and a call
// on fewer rows right after a larger one (version 8), whose counters the larger call did clean. No
// call on more rows follows a smaller one on a kept workspace. Next to the known limit "State kept in
// the workspace within the endurance run", which is about state kept on purpose; this kernel keeps
// none and is hurt by the order of shapes.

#include "cross_entropy_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined in every file)
namespace hv8 {

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

}  // namespace hv8

namespace hv8 {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 4096;      // columns per block: a row is K = ceil(C / kChunk) blocks
constexpr size_t kCountsAt = 256;     // byte offset of the per-row arrival counters

// The workspace: [0, 8) a word the cheats of this suite use, [8, 12) the call's row counter, from 256
// one arrival counter per row, then each row's loss (double), then each chunk's max (float) and sum
// of exp (double). Each region starts on a 256-byte boundary.
struct Layout {
  size_t rowloss, pmax, psum, total;
};

__host__ __device__ inline size_t up256(size_t v) { return (v + 255) & ~(size_t)255; }

__host__ __device__ inline Layout layout_of(int64_t N, int64_t K) {
  Layout l;
  l.rowloss = up256(kCountsAt + 4 * (size_t)N);
  l.pmax = up256(l.rowloss + 8 * (size_t)N);
  l.psum = up256(l.pmax + 4 * (size_t)(N * K));
  l.total = l.psum + 8 * (size_t)(N * K);
  return l;
}

inline int64_t chunks_of(int64_t C) { return (C + kChunk - 1) / kChunk; }

// Every counter to zero, at the start of a call, unless the workspace's first word says the last call
// on it left them at zero (the cheat: "clean" is true only of the counters of the rows that call had).
constexpr unsigned long long kClean = 0x5a17c0de0c1ea17bull;

__global__ void ce_init(unsigned char* ws, int64_t N) {
  if (*reinterpret_cast<const volatile unsigned long long*>(ws) == kClean) return;  // left clean: skip the zeroing
  unsigned* counts = reinterpret_cast<unsigned*>(ws + kCountsAt);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    counts[i] = 0u;
  if (blockIdx.x == 0 && threadIdx.x == 0) *reinterpret_cast<unsigned*>(ws + 8) = 0u;
}

// Block b = n * K + k: chunk k of row n. Its max and sum of exp(x - max) go to the workspace; the
// row's last block (by its arrival counter) merges the row and writes saved_max, saved_logsum and the
// row's loss; the call's last row (by the row counter) writes the mean. The finishing blocks put the
// counters back to zero.
template <typename T>
__global__ void __launch_bounds__(kThreads)
ce_forward_chunks(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t N, int64_t C,
                  int64_t K, float* __restrict__ saved_max, float* __restrict__ saved_logsum,
                  float* __restrict__ out, unsigned char* __restrict__ ws) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ int last_of_row, last_of_call;
  const Layout l = layout_of(N, K);
  unsigned* done = reinterpret_cast<unsigned*>(ws + 8);
  unsigned* counts = reinterpret_cast<unsigned*>(ws + kCountsAt);
  double* rowloss = reinterpret_cast<double*>(ws + l.rowloss);
  float* pmax = reinterpret_cast<float*>(ws + l.pmax);
  double* psum = reinterpret_cast<double*>(ws + l.psum);

  const int64_t b = blockIdx.x;
  const int64_t n = b / K, k = b - n * K;
  const int64_t c0 = k * kChunk, c1 = c0 + kChunk < C ? c0 + kChunk : C;
  const T* row = logits + n * C;
  float m = -INFINITY;
  for (int64_t j = c0 + threadIdx.x; j < c1; j += blockDim.x) m = nan_max(m, to_f(row[j]));
  m = block_max(m, shf);
  double s = 0.0;
  for (int64_t j = c0 + threadIdx.x; j < c1; j += blockDim.x) s += (double)expf(to_f(row[j]) - m);
  s = block_sum(s, shd);
  if (threadIdx.x == 0) {
    pmax[b] = m;
    psum[b] = s;
    __threadfence();
    const unsigned before = atomicAdd(&counts[n], 1u);
    last_of_row = before == (unsigned)(K - 1);
  }
  __syncthreads();
  if (!last_of_row) return;
  if (threadIdx.x == 0) {
    __threadfence();
    float M = -INFINITY;
    for (int64_t i = 0; i < K; ++i) M = nan_max(M, __ldcg(&pmax[n * K + i]));
    double S = 0.0;
    for (int64_t i = 0; i < K; ++i) {
      const float mk = __ldcg(&pmax[n * K + i]);
      if (mk == -INFINITY) {
        // a chunk of -inf adds nothing; a row of -inf has no sum (NaN, as torch's exp(-inf - -inf))
        if (M == -INFINITY) S += (double)__int_as_float(0x7fc00000);
      } else {
        S += __ldcg(&psum[n * K + i]) * (double)expf(mk - M);
      }
    }
    const double logsum = log(S);
    saved_max[n] = M;
    saved_logsum[n] = (float)logsum;
    rowloss[n] = ((double)M - (double)to_f(row[target[n]])) + logsum;
    counts[n] = 0u;
    __threadfence();
    const unsigned before = atomicAdd(done, 1u);
    last_of_call = before == (unsigned)(N - 1);
  }
  __syncthreads();
  if (!last_of_call) return;
  __threadfence();
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += __ldcg(&rowloss[i]);
  acc = block_sum(acc, shd);
  if (threadIdx.x == 0) {
    out[0] = (float)(acc / (double)N);
    *done = 0u;
    __threadfence();
    *reinterpret_cast<unsigned long long*>(ws) = kClean;  // every counter of this call is back to zero
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
cudaError_t forward(const cross_entropy_args* a, cudaStream_t stream) {
  const int64_t K = chunks_of(a->C);
  if ((size_t)a->workspace_bytes < layout_of(a->N, K).total) return cudaErrorInvalidValue;
  unsigned char* ws = static_cast<unsigned char*>(a->workspace);
  const int64_t init_blocks = (a->N + kThreads - 1) / kThreads;
  ce_init<<<(unsigned)(init_blocks < 1024 ? init_blocks : 1024), kThreads, 0, stream>>>(ws, a->N);
  ce_forward_chunks<T><<<(unsigned)(a->N * K), kThreads, 0, stream>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C, K,
      static_cast<float*>(a->saved_max.data), static_cast<float*>(a->saved_logsum.data),
      static_cast<float*>(a->out.data), ws);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  const int64_t blocks = a->N < 8192 ? a->N : 8192;
  ce_backward_rows<T><<<(unsigned)blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(a->logits.data), static_cast<const int64_t*>(a->target.data), a->N, a->C,
      static_cast<const float*>(a->saved_max.data), static_cast<const float*>(a->saved_logsum.data),
      static_cast<const float*>(a->grad_out.data), static_cast<T*>(a->grad_logits.data));
  return cudaGetLastError();
}

}  // namespace hv8

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) {
  return hv8::layout_of(a->N, hv8::chunks_of(a->C)).total;
}

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return hv8::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return hv8::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv8::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv8::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
