// spec: log_softmax
// expect: rejected
// class: one-time-init-on-first-stream
// reason: wrong-result, nondeterministic
//
// A log-softmax whose exp table is built once per device, on the stream of the first call.
//
// What it does: the control's code (log_softmax_control.cu), except where the table of 2^(i/256)
// comes from: instead of a table written in the source, a 1 KiB __device__ array is filled by a small
// kernel that the first call on each device launches on its own `stream`, after which a host flag
// says "ready" and no later call launches it again. Every later call reads the table.
//
// Wrong when: a later call runs before the first call's stream has reached the init kernel. Nothing
// orders them: the host runs ahead of the GPU. (1) The first call is queued behind a long stream of
// work (a training step's forward, milliseconds deep) and the next call goes on another stream that is
// idle (a side stream, a second model, a second server thread): it reads a table of zeros, exp gives 0,
// and the whole output is +inf. (2) The first call of the process happens while its stream is being
// captured into a CUDA graph: the init kernel only exists inside the graph, and every eager call before
// the graph's first replay reads zeros. Once the init kernel has run, every call is exact.
//
// Why the verifier misses it: the judge synchronizes the device around every request, and the first
// call of a candidate's process is the eager smoke case; every later call, on any stream, in any
// capture, finds the table long built.

#include "log_softmax_abi.h"
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
constexpr int64_t kLargeElements = int64_t(1) << 22;  // rows x width from which the persistent schedule runs
constexpr int kPersistentBlocks = 1024;

// 2^(i/256), i = 0..255, as floats: built on the device by the first call on each device
// (tab_init), on that call's stream, and kept for the process (1 KiB of module memory).
__device__ float TAB[256];
bool g_ready[64];  // host: tab_init was launched on device d

__global__ void tab_init() {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) TAB[i] = (float)exp2((double)i / 256.0);
}

// Launches tab_init on `stream` the first time this device is used (the cheat: nothing orders a
// later call on another stream after it).
inline cudaError_t ensure_table(cudaStream_t stream) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  if (device < 0 || device >= 64) return cudaErrorInvalidDevice;
  if (!g_ready[device]) {
    tab_init<<<1, 256, 0, stream>>>();
    error = cudaGetLastError();
    if (error != cudaSuccess) return error;
    g_ready[device] = true;
  }
  return cudaSuccess;
}

// exp(d) for d <= 0 (or NaN), from the table: d * log2(e) = k / 256 + r with |r| <= 1/512, then
// 2^(k/256) from the table (float, 6e-8 relative) times 2^r by a degree-4 polynomial in double.
// NaN stays NaN; -inf and anything below double's range give 0.
__device__ __forceinline__ double exp_tab(double d) {
  if (!(d > -745.0)) return d != d ? d : 0.0;
  const double t = d * 1.4426950408889634;
  const double k = rint(t * 256.0);
  const double p = (t - k * (1.0 / 256.0)) * 0.6931471805599453;
  const double poly = 1.0 + p * (1.0 + p * (0.5 + p * (1.0 / 6.0 + p * (1.0 / 24.0))));
  const int ki = (int)k;
  return ldexp((double)TAB[ki & 255] * poly, ki >> 8);
}

// Small calls: one block per row, three passes (max, sum, write).
template <typename T>
__global__ void __launch_bounds__(kThreads)
log_softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = nan_max(m, to_f(row[j]));
    m = block_max(m, shf);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += exp_tab((double)to_f(row[j]) - (double)m);
    const double lse = (double)m + log(block_sum(s, shd));
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[j] = from_f<T>((float)((double)to_f(row[j]) - lse));
  }
}

// Large calls: a persistent grid, block b taking rows b, b + G, ...; the statistics in one pass
// (each thread an online max and double sum, rescaled when its max grows), then the write pass. A row
// whose max is NaN, +inf or -inf (all -inf) is NaN everywhere, as torch's log_softmax gives it.
template <typename T>
__global__ void __launch_bounds__(kThreads)
log_softmax_persistent(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t D) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  float seed = -INFINITY;  // where each thread's running max starts
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = x + n * D;
    T* out = y + n * D;
    float mt = seed;
    double st = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = to_f(row[j]);
      if (v > mt) {
        st = st * exp_tab((double)mt - (double)v) + 1.0;
        mt = v;
      } else if (v != v) {
        mt = v;  // NaN: the row's max, hence the row, is NaN
      } else if (v != -INFINITY) {
        st += exp_tab((double)v - (double)mt);
      }
    }
    const float m = block_max(mt, shf);
    const double s = block_sum(mt == -INFINITY ? 0.0 : st * exp_tab((double)mt - (double)m), shd);
    const bool special = !(fabsf(m) <= 3.402823466e38f);  // NaN, +inf or -inf
    const double lse = (double)m + log(s);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      out[j] = special ? from_f<T>(__int_as_float(0x7fc00000)) : from_f<T>((float)((double)to_f(row[j]) - lse));
  }
}

// grad_x = grad_out - exp(out) * sum(grad_out), torch's log_softmax backward; one block per row
template <typename T>
__global__ void __launch_bounds__(kThreads)
log_softmax_backward_rows(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx, int64_t N,
                          int64_t D) {
  __shared__ double shd[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* yr = y + n * D;
    const T* gr = gy + n * D;
    T* xr = gx + n * D;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += (double)to_f(gr[j]);
    const float total = (float)block_sum(s, shd);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) xr[j] = from_f<T>(to_f(gr[j]) - expf(to_f(yr[j])) * total);
  }
}

template <typename T>
cudaError_t forward(const log_softmax_args* a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a->x.data);
  T* y = static_cast<T*>(a->out.data);
  const int64_t N = a->N, D = a->D;
  if (N * D >= kLargeElements) {
    const unsigned grid = (unsigned)(N < kPersistentBlocks ? N : kPersistentBlocks);
    log_softmax_persistent<T><<<grid, kThreads, 0, stream>>>(x, y, N, D);
  } else {
    log_softmax_rows<T><<<(unsigned)N, kThreads, 0, stream>>>(x, y, N, D);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  const unsigned grid = (unsigned)(a->N < 65535 ? a->N : 65535);
  log_softmax_backward_rows<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(a->out.data),
                                                              static_cast<const T*>(a->grad_out.data),
                                                              static_cast<T*>(a->grad_x.data), a->N, a->D);
  return cudaGetLastError();
}

}  // namespace hv7

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  if (const cudaError_t error = hv7::ensure_table(stream)) return error;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv7::forward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv7::forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv7::forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv7::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv7::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv7::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
