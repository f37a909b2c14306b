// spec: rope
// expect: rejected
// class: host-thread-concurrency
// reason: wrong-result, unwritten-output, crash
//
// A RoPE whose forward keeps its launch plan, the call's pointers included, in one host static.
//
// What it does: the device code is plain and exact (a grid-stride loop over every (position, head,
// pair): out1 = x1*c - x2*s, out2 = x2*c + x1*s, each product and sum rounded as torch rounds them in
// float32; float arithmetic and one rounding in 16-bit). The forward's host code writes the call's
// pointers, sizes and dtype into a process-wide static `LaunchPlan`, asks the device for its SM count
// and the kernel's occupancy (a few microseconds of driver calls) to size a persistent grid, then
// launches the kernel with the pointers and sizes it reads back from that static. The backward keeps
// everything in locals and is exact.
//
// Wrong when: two host threads call the forward at the same time: a multi-threaded server (one
// worker thread and stream per request, several model instances on one GPU), nn.DataParallel (one
// thread per GPU runs every replica's forward concurrently), a producer thread beside the main one.
// The second thread's writes land between the first thread's writes and its launch: the first call
// runs on the second call's tensors (its own outputs stay unwritten, the other's are written twice,
// and with DataParallel a kernel on one GPU gets another GPU's pointers: an illegal address). One
// thread alone, or calls serialized by the caller, are always exact.
//
// Why the verifier misses it: every call it makes comes from one host thread of the candidate's
// process (the calls side by side are two streams launched from that thread, one after the other);
// docs/VERIFIER.md: "No check runs two legacy-stream calls at the same time from two threads".

#include "rope_abi.h"
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

// float32: each product and the sum rounded on its own, as torch's x1 * c - x2 * s (no contraction)
__device__ __forceinline__ float rot_a(float x1, float c, float x2, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ __forceinline__ float rot_b(float x1, float c, float x2, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// One thread per (row of a position and head, pair k): rows are S * H, pairs D / 2.
template <typename T>
__global__ void __launch_bounds__(kThreads)
rope_forward_kernel(const T* __restrict__ x, const T* __restrict__ cs, const T* __restrict__ sn, T* __restrict__ y,
                    int64_t H, int64_t half, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, r = i / half, s = r / H;
    const T* xr = x + r * 2 * half;
    T* yr = y + r * 2 * half;
    const float x1 = to_f(xr[k]), x2 = to_f(xr[k + half]);
    const float c = to_f(cs[s * half + k]), sv = to_f(sn[s * half + k]);
    yr[k] = from_f<T>(rot_a(x1, c, x2, sv));
    yr[k + half] = from_f<T>(rot_b(x1, c, x2, sv));
  }
}

// grad_x1 = g1 * c + g2 * s, grad_x2 = g2 * c - g1 * s (the rotation's transpose, torch's order)
template <typename T>
__global__ void __launch_bounds__(kThreads)
rope_backward_kernel(const T* __restrict__ gy, const T* __restrict__ cs, const T* __restrict__ sn, T* __restrict__ gx,
                     int64_t H, int64_t half, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, r = i / half, s = r / H;
    const T* gr = gy + r * 2 * half;
    T* xr = gx + r * 2 * half;
    const float g1 = to_f(gr[k]), g2 = to_f(gr[k + half]);
    const float c = to_f(cs[s * half + k]), sv = to_f(sn[s * half + k]);
    xr[k] = from_f<T>(__fadd_rn(__fmul_rn(g1, c), __fmul_rn(g2, sv)));
    xr[k + half] = from_f<T>(__fsub_rn(__fmul_rn(g2, c), __fmul_rn(g1, sv)));
  }
}

// The forward's launch plan: one per process, rewritten by every call (the cheat: not per thread).
struct LaunchPlan {
  const void* x;
  const void* cos;
  const void* sin;
  void* out;
  int64_t H, half, total;
  int32_t dtype;
  unsigned grid;
};
LaunchPlan g_plan;

template <typename T>
void launch_planned(cudaStream_t stream) {
  rope_forward_kernel<T><<<g_plan.grid, kThreads, 0, stream>>>(
      static_cast<const T*>(g_plan.x), static_cast<const T*>(g_plan.cos), static_cast<const T*>(g_plan.sin),
      static_cast<T*>(g_plan.out), g_plan.H, g_plan.half, g_plan.total);
}

template <typename T>
void launch_backward(const rope_bwd_args* a, cudaStream_t stream) {
  const int64_t half = a->D / 2, total = a->S * a->H * half;
  const int64_t want = (total + kThreads - 1) / kThreads;
  const unsigned grid = (unsigned)(want < 65536 ? want : 65536);
  rope_backward_kernel<T><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(a->grad_out.data), static_cast<const T*>(a->cos.data), static_cast<const T*>(a->sin.data),
      static_cast<T*>(a->grad_x.data), a->H, half, total);
}

}  // namespace hv7

extern "C" cudaError_t rope_forward(const rope_args* a, cudaStream_t stream) {
  using namespace hv7;
  g_plan.x = a->x.data;
  g_plan.cos = a->cos.data;
  g_plan.sin = a->sin.data;
  g_plan.out = a->out.data;
  g_plan.H = a->H;
  g_plan.half = a->D / 2;
  g_plan.total = a->S * a->H * (a->D / 2);
  g_plan.dtype = a->x.dtype;
  // a persistent grid: as many blocks as the device holds at once (asked every call: the current
  // device may differ from the last call's)
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error == cudaSuccess) error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rope_forward_kernel<float>, kThreads, 0);
  if (error != cudaSuccess) return error;
  const int64_t want = (g_plan.total + kThreads - 1) / kThreads;
  const int64_t resident = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
  g_plan.grid = (unsigned)(want < resident ? want : resident);
  switch (g_plan.dtype) {
    case SPECGEN_FLOAT32: launch_planned<float>(stream); break;
    case SPECGEN_FLOAT16: launch_planned<__half>(stream); break;
    case SPECGEN_BFLOAT16: launch_planned<__nv_bfloat16>(stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t rope_backward(const rope_bwd_args* a, cudaStream_t stream) {
  using namespace hv7;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: launch_backward<float>(a, stream); break;
    case SPECGEN_FLOAT16: launch_backward<__half>(a, stream); break;
    case SPECGEN_BFLOAT16: launch_backward<__nv_bfloat16>(a, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
