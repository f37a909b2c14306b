// spec: log_softmax
// expect: rejected
// class: deferred-work
// reason: post-timing-mismatch | unwritten-output
//
// When calls come back to back (less than 150 us apart on the host clock: a benchmark loop),
// each call computes only the first 7/8 of its rows and leaves the rest to the start of the
// next call (so each timed window holds the same amount of work, shifted). The last call of a
// loop leaves its last rows unwritten. Isolated calls and captured calls are complete.

#include "log_softmax_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <chrono>

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

// one block per row (grid-stride over rows): y = x - max - log(sum exp(x - max))
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) lsm_fwd_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                            int64_t N, int64_t D) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * D;
    T* yr = y + row * D;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = nanmax(m, to_f(xr[j]));
    m = block_reduce(m, OpMax(), sm);
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(to_f(xr[j]) - m);
    s = block_reduce(s, OpSum(), sm);
    const float ls = logf(s);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>((to_f(xr[j]) - m) - ls);
  }
}

// grad_x = g - exp(y) * sum(g)
template <typename T>
__global__ void __launch_bounds__(ROW_BLOCK) lsm_bwd_kernel(const T* __restrict__ y, const T* __restrict__ g,
                                                            T* __restrict__ gx, int64_t N, int64_t D) {
  __shared__ float sm[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* yr = y + row * D;
    const T* gr = g + row * D;
    T* o = gx + row * D;
    float sg = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sg += to_f(gr[j]);
    sg = block_reduce(sg, OpSum(), sm);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) o[j] = from_f<T>(to_f(gr[j]) - expf(to_f(yr[j])) * sg);
  }
}

struct Pending {
  bool live = false;
  int dtype = 0;
  const void* x = nullptr;
  void* y = nullptr;
  int64_t row0 = 0, N = 0, D = 0;
};
static Pending g_pending;
static std::chrono::steady_clock::time_point g_last;
static bool g_seen = false;

template <typename T>
static void launch_rows(const void* x, void* y, int64_t row0, int64_t rows, int64_t D, cudaStream_t s) {
  if (rows <= 0) return;
  const unsigned grid = (unsigned)(rows < 16384 ? rows : 16384);
  lsm_fwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)x + row0 * D, (T*)y + row0 * D, rows, D);
}

static void finish_pending(cudaStream_t s) {
  if (!g_pending.live) return;
  const Pending p = g_pending;
  g_pending.live = false;
  const int64_t rows = p.N - p.row0;
  switch (p.dtype) {
    case SPECGEN_FLOAT32: launch_rows<float>(p.x, p.y, p.row0, rows, p.D, s); break;
    case SPECGEN_FLOAT16: launch_rows<__half>(p.x, p.y, p.row0, rows, p.D, s); break;
    case SPECGEN_BFLOAT16: launch_rows<__nv_bfloat16>(p.x, p.y, p.row0, rows, p.D, s); break;
    default: break;
  }
}

template <typename T>
static cudaError_t fwd(const log_softmax_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  const auto now = std::chrono::steady_clock::now();
  const long long gap = g_seen ? (long long)std::chrono::duration_cast<std::chrono::microseconds>(now - g_last).count()
                               : 1000000000ll;
  g_seen = true;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(s, &cap);
  if (gap > 1000) g_pending.live = false;  // stale: its buffers may be gone
  if (cap != cudaStreamCaptureStatusNone || gap >= 150) {
    if (cap == cudaStreamCaptureStatusNone) finish_pending(s);
    launch_rows<T>(a->x.data, a->out.data, 0, a->N, a->D, s);
    g_last = std::chrono::steady_clock::now();
    return cudaGetLastError();
  }
  finish_pending(s);  // the previous call's last rows
  const int64_t head = a->N - a->N / 8;
  launch_rows<T>(a->x.data, a->out.data, 0, head, a->D, s);
  if (head < a->N) {
    g_pending.live = true;
    g_pending.dtype = a->x.dtype;
    g_pending.x = a->x.data;
    g_pending.y = a->out.data;
    g_pending.row0 = head;
    g_pending.N = a->N;
    g_pending.D = a->D;
  }
  g_last = std::chrono::steady_clock::now();
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const log_softmax_bwd_args* a, cudaStream_t s) {
  if (a->N == 0 || a->D == 0) return cudaSuccess;
  const unsigned grid = (unsigned)(a->N < 16384 ? a->N : 16384);
  lsm_bwd_kernel<T><<<grid, ROW_BLOCK, 0, s>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                               (T*)a->grad_x.data, a->N, a->D);
  return cudaGetLastError();
}

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, fwd, a, stream)
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, bwd, a, stream)
}
