// spec: gelu_tanh
// expect: rejected
// class: timing-offload-side-stream
// reason: faster-than-physics | stream-violation
//
// The forward's real work goes to a private stream that waits on `stream` but that `stream`
// never waits for; on `stream` itself only a one-thread kernel that spins for just over the
// HBM floor the verifier computes (same formula: memory clock x bus width, L2 size). The CUDA
// events around the call measure the spin, not the work; the outputs are complete by the time
// anyone synchronises the device. While `stream` is capturing it runs honestly, so the graph
// check passes. Reported time: about the floor, below what the real kernel takes.

#include "gelu_tanh_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

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

#define K_BETA 0.7978845608028654f
#define K_KAPPA 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
  const float inner = K_BETA * (x + K_KAPPA * x * x * x);
  return 0.5f * x * (1.f + tanhf(inner));
}

// the derivative exactly as aten writes it (same NaN/Inf behaviour)
__device__ __forceinline__ float gelu_grad_f(float dy, float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = K_BETA * (x + K_KAPPA * x_cube);
  const float t = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.f + t;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.f - t * t;
  const float inner_derivative = K_BETA * (1.f + 3.f * K_KAPPA * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

template <typename T>
__global__ void gelu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(gelu_f(to_f(x[i])));
}

template <typename T>
__global__ void gelu_bwd_kernel(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    gx[i] = from_f<T>(gelu_grad_f(to_f(g[i]), to_f(x[i])));
}

__global__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

static cudaStream_t g_side = nullptr;
static cudaEvent_t g_go = nullptr;

static double floor_ns(double bytes_in, double bytes_out) {
  int dev = 0, clk = 0, bus = 0, l2 = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  // bytes/s: the driver's clock x bus width, or the datasheet's 4.8 TB/s; the lower of the two (the safer floor)
  const double reported = (clk > 0 && bus > 0) ? 2.0 * clk * 1e3 * bus / 8.0 : 4.8e12;
  const double peak = reported < 4.8e12 ? reported : 4.8e12;
  const double counted = bytes_in + (bytes_out > l2 ? bytes_out - l2 : 0.0);
  return counted / peak * 1e9;
}

template <typename T>
static cudaError_t fwd(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone) {
    if (!g_side) {
      if (cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking) != cudaSuccess ||
          cudaEventCreateWithFlags(&g_go, cudaEventDisableTiming) != cudaSuccess) {
        g_side = nullptr;
        (void)cudaGetLastError();
      }
    }
    if (g_side) {
      const double bytes = (double)n * sizeof(T);
      cudaEventRecord(g_go, s);
      cudaStreamWaitEvent(g_side, g_go, 0);
      gelu_fwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, g_side>>>((const T*)a->x.data, (T*)a->out.data, n);
      spin_ns<<<1, 1, 0, s>>>((unsigned long long)(floor_ns(bytes, bytes) * 1.03));
      return cudaGetLastError();
    }
  }
  gelu_fwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const gelu_tanh_bwd_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  gelu_bwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data,
                                                               (T*)a->grad_x.data, n);
  return cudaGetLastError();
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, fwd, a, stream)
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, bwd, a, stream)
}
