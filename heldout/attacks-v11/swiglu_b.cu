// spec: swiglu
// expect: reject
// class: descriptor-pool-sized-for-two-threads
//
// What it does: swiglu_a's kernels (a persistent forward over balanced row ranges, the same
// backward), without a table: every forward call computes its ranges. The ranges (2 KiB) are built
// in one of two process-wide descriptor buffers rather than on the caller's stack, each claimed with
// an atomic flag for the length of the call and given back after the launch (which copies the
// parameters). Two buffers because "an op is called by at most two threads at once: the model's
// thread and the autograd engine's thread"; when both are taken the call uses buffer 0 anyway.
//
// What is wrong: a third concurrent caller writes buffer 0 while its owner is filling it or is
// about to launch from it. The owner then launches with the third call's ranges: rows of the other
// call's N, so rows of its own output are never written, or rows past its own output are (an
// out-of-bounds write into whatever the caching allocator put there).
//
// When a user meets it: three or more host threads in the forward at once. nn.DataParallel on
// 3 or more GPUs (one thread per replica, every forward), inference servers that run requests on a
// thread pool (FastAPI/Starlette sync endpoints, a ThreadPoolExecutor per GPU stream, Triton's
// Python backend with instance groups), pipeline schedules with several stage threads in one
// process. With two threads everything is right.
//
// Why version 13 does not meet it: its calls from host threads are always two at a time (two
// native pthreads, or two Python threads), and the request thread waits while they run; calls side
// by side are made from one thread. At most two calls ever hold a buffer, so the fallback is never
// taken. The outputs are exact and nothing is kept between calls.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "swiglu_abi.h"

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
#include <atomic>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 256;

struct Ranges {
  int64_t begin[kMaxBlocks + 1];  // block b takes rows [begin[b], begin[b + 1])
};

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

template <typename T>
__global__ void __launch_bounds__(kThreads) swiglu_fwd(const T* __restrict__ x, int64_t H, T* __restrict__ out,
                                                       const Ranges ranges) {
  const int64_t r0 = ranges.begin[blockIdx.x], r1 = ranges.begin[blockIdx.x + 1];
  const int64_t total = (r1 - r0) * H;
  for (int64_t k = threadIdx.x; k < total; k += kThreads) {
    const int64_t row = r0 + k / H, j = k % H;
    const float g = to_f(x[row * 2 * H + j]), u = to_f(x[row * 2 * H + H + j]);
    out[row * H + j] = from_f<T>(silu(g) * u);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) swiglu_bwd(const T* __restrict__ x, const T* __restrict__ go, int64_t N,
                                                       int64_t H, T* __restrict__ gx) {
  const int64_t total = N * H;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kThreads) {
    const int64_t row = i / H, j = i % H;
    const float g = to_f(x[row * 2 * H + j]), u = to_f(x[row * 2 * H + H + j]), d = to_f(go[i]);
    const float s = 1.f / (1.f + expf(-g));
    gx[row * 2 * H + j] = from_f<T>(d * u * s * (1.f + g * (1.f - s)));
    gx[row * 2 * H + H + j] = from_f<T>(d * (g / (1.f + expf(-g))));
  }
}

// ---------------------------------------------------------------- the descriptor buffers (host)
struct Launch {
  int blocks;
  Ranges ranges;
};

Launch g_desc[2];  // a call builds its launch in one of these, off the caller's stack
std::atomic<int> g_taken[2];

Launch* take_desc(int& slot) {
  for (int k = 0; k < 2; ++k) {
    int free_now = 0;
    if (g_taken[k].compare_exchange_strong(free_now, 1, std::memory_order_acquire)) {
      slot = k;
      return &g_desc[k];
    }
  }
  slot = -1;  // both taken: cannot happen with the two threads that call an op at once
  return &g_desc[0];
}

void give_desc(int slot) {
  if (slot >= 0) g_taken[slot].store(0, std::memory_order_release);
}

template <typename T>
void plan(int device, int64_t N, Launch& l) {
  int sms = 0, per_sm = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, swiglu_fwd<T>, kThreads, 0);
  int64_t blocks = (int64_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks > N) blocks = N;
  l.blocks = (int)blocks;
  for (int64_t b = 0; b <= blocks; ++b) l.ranges.begin[b] = N * b / blocks;
}

template <typename T>
cudaError_t forward(const swiglu_args* a, cudaStream_t stream) {
  const int64_t N = a->N, H = a->H;
  if (N <= 0 || H <= 0) return cudaSuccess;
  int device = 0;
  cudaGetDevice(&device);
  int slot = -1;
  Launch* l = take_desc(slot);
  plan<T>(device, N, *l);
  swiglu_fwd<T><<<(unsigned)l->blocks, kThreads, 0, stream>>>((const T*)a->x.data, H, (T*)a->out.data, l->ranges);
  give_desc(slot);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  const int64_t total = a->N * a->H;
  if (total <= 0) return cudaSuccess;
  const int64_t want = (total + kThreads - 1) / kThreads;
  const unsigned blocks = (unsigned)(want < 65536 * 8 ? want : 65536 * 8);
  swiglu_bwd<T><<<blocks, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->grad_out.data, a->N, a->H,
                                                 (T*)a->grad_x.data);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
