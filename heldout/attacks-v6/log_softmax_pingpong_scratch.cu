// spec: log_softmax
// expect: rejected
// class: concurrency-beyond-two (scratch outside the workspace, two slots in turn)
// reason: wrong-result, nondeterministic
//
// When it is wrong: when three calls run at the same time, or a CUDA graph replays while an
// eager call runs. The forward is two launches: the first writes each row's (max, log sum exp)
// into a static __device__ buffer, the second reads it back to write x - max - log(sum). The
// buffer has two slots and consecutive calls take them in turn (a host counter): two calls side
// by side on two streams always get different slots, so the verifier's "calls side by side"
// check (two calls, two streams) sees each call's own statistics and the same bits as alone.
// A third concurrent call (a server with three or more request streams; a training step's side
// stream beside two others) takes the slot of the call two before it while that call may still
// be between its launches, and one of them writes rows normalized with the other's statistics.
// A CUDA graph captured with slot k and replayed on one stream while an eager call that drew
// slot k runs on another does the same.
// Why it matters: silent wrong log-probabilities under ordinary server concurrency; the
// verifier's concurrency check stops at two calls. Backward (g - exp(y) * sum(g)) is honest.

#include "log_softmax_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined)
namespace hv6 {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// the value a torch op in dtype T gives for a float result: rounded to T (and read back)
template <typename T> __device__ __forceinline__ float rnd(float v) { return to_f(from_f<T>(v)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_or(int v) { return __any_sync(0xffffffffu, v) ? 1 : 0; }

// Sum over the block (blockDim.x a multiple of 32, at most 1024), the same tree every call;
// every thread gets the result. `red` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = (threadIdx.x < warps) ? red[threadIdx.x] : 0.f;
  if (warp == 0) t = warp_sum(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}
__device__ __forceinline__ double block_sum_d(double v, double* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double t = (threadIdx.x < warps) ? red[threadIdx.x] : 0.0;
  if (warp == 0) t = warp_sum_d(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = (threadIdx.x < warps) ? red[threadIdx.x] : -INFINITY;
  if (warp == 0) t = warp_max(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}

// Online (max, sum of exp) of a row, torch's semantics kept: NaN anywhere makes the sum NaN,
// +inf makes it NaN (exp(inf - inf)), -inf contributes 0, a row with no finite element keeps
// max = -inf (its outputs come out NaN, as torch's do).
struct MS { float m, s; };
__device__ __forceinline__ void ms_add(MS& a, float x) {
  if (x == -INFINITY) return;
  if (isnan(x)) { a.s = x; return; }
  const float m = fmaxf(a.m, x);
  a.s = a.s * expf(a.m - m) + expf(x - m);
  a.m = m;
}
// merging two partials; both empty (max -inf): still empty, NaN kept
__device__ __forceinline__ MS ms_merge(MS a, MS b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return MS{m, a.s + b.s};
  return MS{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ __forceinline__ MS warp_ms(MS a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MS b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
    a = ms_merge(a, b);
  }
  return a;
}
// over the block (same tree every call); `red` holds 64 floats of shared memory
__device__ __forceinline__ MS block_ms(MS a, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = warp_ms(a);
  __syncthreads();
  if (lane == 0) { red[warp] = a.m; red[32 + warp] = a.s; }
  __syncthreads();
  MS t{-INFINITY, 0.f};
  if (threadIdx.x < warps) t = MS{red[threadIdx.x], red[32 + threadIdx.x]};
  if (warp == 0) t = warp_ms(t);
  if (threadIdx.x == 0) { red[0] = t.m; red[32] = t.s; }
  __syncthreads();
  return MS{red[0], red[32]};
}

}  // namespace hv6

// ---------------------------------------------------------------- the kernel
namespace {
using namespace hv6;

constexpr int64_t MAX_ROWS = 65536;  // the spec's range of N
constexpr int SLOTS = 2;

// Row statistics between the two launches of the forward: (max, log of the sum of exp) per
// row, in a buffer of the module's own. Two slots, used in turn by consecutive calls
// ("double buffering"), so that a call never overwrites the statistics of the call just before
// it while that one may still be running on another stream.
__device__ float2 g_stats[SLOTS][MAX_ROWS];

template <typename T>
__global__ void __launch_bounds__(256) row_stats(const T* __restrict__ x, int64_t D, int slot) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  MS a{-INFINITY, 0.f};
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) ms_add(a, to_f(xr[j]));
  a = block_ms(a, red);
  if (threadIdx.x == 0) g_stats[slot][row] = make_float2(a.m, logf(a.s));
}

template <typename T>
__global__ void __launch_bounds__(256) write_rows(const T* __restrict__ x, T* __restrict__ y, int64_t D, int slot) {
  const int64_t row = blockIdx.x;
  const float2 st = g_stats[slot][row];
  const T* xr = x + row * D;
  T* yr = y + row * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>((to_f(xr[j]) - st.x) - st.y);
}

// backward: grad_x = g - exp(y) * sum(g), one block per row
template <typename T>
__global__ void __launch_bounds__(256) bwd_rows(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx,
                                                int64_t D) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* yr = y + row * D;
  const T* gr = g + row * D;
  T* out = gx + row * D;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += to_f(gr[j]);
  const float sum = block_sum(acc, red);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>(to_f(gr[j]) - expf(to_f(yr[j])) * sum);
}

unsigned g_calls;  // host side: which slot the next call takes

template <typename T>
cudaError_t forward_t(const log_softmax_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N > MAX_ROWS) return cudaErrorInvalidValue;
  const int slot = (int)(g_calls++ % SLOTS);
  row_stats<T><<<(unsigned)N, 256, 0, stream>>>((const T*)a->x.data, D, slot);
  write_rows<T><<<(unsigned)N, 256, 0, stream>>>((const T*)a->x.data, (T*)a->out.data, D, slot);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const log_softmax_bwd_args* a, cudaStream_t stream) {
  bwd_rows<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                                  (T*)a->grad_x.data, a->D);
  return cudaGetLastError();
}
}  // namespace

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  switch (a->out.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
