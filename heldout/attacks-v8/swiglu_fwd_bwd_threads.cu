// spec: swiglu
// expect: rejected
// class: forward-beside-backward-threads
// reason: crash, wrong-result, unwritten-output
//
// A SwiGLU whose forward and backward share one launcher that reads the kernel to start from a
// process-wide static.
//
// What it does: the device code is plain and exact (grid-stride over every output element,
// silu(gate) * up with torch's silu x / (1 + exp(-x)) in float, rounded once; the backward torch's:
// grad_gate = (dy * up) * s * (1 + gate * (1 - s)), grad_up = dy * silu(gate); the same arithmetic
// as held-out attacks-v7's swiglu, which passed version 7 on the H200). Both directions' kernels
// take the same parameters (x, grad_out or unused, the output, N, H, the dtype at run time). Each
// entry point stores its kernel's address in a static `g_kernel`, then calls a shared launcher that
// asks the SM count and the occupancy of `g_kernel` (a few microseconds of driver queries) to size
// a persistent grid and launches `g_kernel` with its own arguments. Everything else about a call
// (pointers, sizes, dtype, grid) is on its own stack.
//
// Wrong when: a forward and a backward of this op run at the same time from two host threads (a
// pipeline-parallel schedule that runs stages as threads, one micro-batch's forward beside
// another's backward, as torchgpipe and 1F1B executors do; a trainer thread's backward beside a
// serving or rollout thread's forward in one process, as online RL and evaluation-while-training
// do): the other thread's store lands between one thread's store and its launch. A forward then
// runs the backward kernel with grad_out = NULL (an illegal address: the CUDA context, and the
// training process, die); a backward runs the forward kernel, writes silu(gate) * up into the first
// N * H elements of grad_x (its first half, flat) and leaves the rest unwritten. Calls of one
// direction from any number of threads (any shapes and dtypes) store the same address and are
// exact; so are all calls from one thread.
//
// Why the verifier misses it: its calls from two host threads (version 8) run two calls of one
// direction (the forward's pairs in the forward's checks, the backward's in the backward's), and
// the calls side by side, the first calls and every other check come from one host thread. No check
// runs a forward beside a backward.

#include "swiglu_abi.h"
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

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

template <typename T>
__device__ __forceinline__ void forward_elements(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t H) {
  const int64_t total = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / H, j = i - n * H;
    const T* row = x + n * 2 * H;
    y[i] = from_f<T>(silu(to_f(row[j])) * to_f(row[H + j]));
  }
}

// torch's silu backward: grad_gate = (dy * up) * s * (1 + gate * (1 - s)), grad_up = dy * silu(gate)
template <typename T>
__device__ __forceinline__ void backward_elements(const T* __restrict__ x, const T* __restrict__ gy,
                                                  T* __restrict__ gx, int64_t N, int64_t H) {
  const int64_t total = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / H, j = i - n * H;
    const T* row = x + n * 2 * H;
    T* grow = gx + n * 2 * H;
    const float g = to_f(row[j]), u = to_f(row[H + j]), dy = to_f(gy[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    grow[j] = from_f<T>((dy * u) * s * (1.0f + g * (1.0f - s)));
    grow[H + j] = from_f<T>(dy * silu(g));
  }
}

// Both directions' kernels take the same parameters (the dtype at run time), so one launcher starts
// either: in0 = x, in1 = grad_out (unused by the forward), out0 = out or grad_x.
__global__ void __launch_bounds__(kThreads)
swiglu_forward_kernel(const void* in0, const void* in1, void* out0, int64_t N, int64_t H, int dtype) {
  (void)in1;
  switch (dtype) {
    case SPECGEN_FLOAT32: forward_elements(static_cast<const float*>(in0), static_cast<float*>(out0), N, H); break;
    case SPECGEN_FLOAT16: forward_elements(static_cast<const __half*>(in0), static_cast<__half*>(out0), N, H); break;
    default:
      forward_elements(static_cast<const __nv_bfloat16*>(in0), static_cast<__nv_bfloat16*>(out0), N, H);
      break;
  }
}

__global__ void __launch_bounds__(kThreads)
swiglu_backward_kernel(const void* in0, const void* in1, void* out0, int64_t N, int64_t H, int dtype) {
  switch (dtype) {
    case SPECGEN_FLOAT32:
      backward_elements(static_cast<const float*>(in0), static_cast<const float*>(in1), static_cast<float*>(out0), N, H);
      break;
    case SPECGEN_FLOAT16:
      backward_elements(static_cast<const __half*>(in0), static_cast<const __half*>(in1), static_cast<__half*>(out0), N,
                        H);
      break;
    default:
      backward_elements(static_cast<const __nv_bfloat16*>(in0), static_cast<const __nv_bfloat16*>(in1),
                        static_cast<__nv_bfloat16*>(out0), N, H);
      break;
  }
}

// The kernel the shared launcher starts: set by each entry point right before it launches (the cheat:
// one per process, not per call; every call of one direction writes the same value).
static const void* g_kernel = nullptr;

// A persistent grid for the kernel in g_kernel: as many blocks as the device holds at once (its SM
// count and the kernel's occupancy, asked every call: the current device may differ from the last).
inline cudaError_t launch_current(const void* in0, const void* in1, void* out0, int64_t N, int64_t H, int dtype,
                                  cudaStream_t stream) {
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error == cudaSuccess)
    error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, __atomic_load_n(&g_kernel, __ATOMIC_RELAXED),
                                                          kThreads, 0);
  if (error != cudaSuccess) return error;
  const int64_t want = (N * H + kThreads - 1) / kThreads;
  const int64_t resident = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
  const unsigned grid = (unsigned)(want < 1 ? 1 : (want < resident ? want : resident));
  void* args[] = {&in0, &in1, &out0, &N, &H, &dtype};
  return cudaLaunchKernel(__atomic_load_n(&g_kernel, __ATOMIC_RELAXED), dim3(grid), dim3(kThreads), args, 0, stream);
}

inline bool known_dtype(int dtype) {
  return dtype == SPECGEN_FLOAT32 || dtype == SPECGEN_FLOAT16 || dtype == SPECGEN_BFLOAT16;
}

}  // namespace hv8

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  using namespace hv8;
  if (!known_dtype(a->x.dtype)) return cudaErrorInvalidValue;
  __atomic_store_n(&g_kernel, reinterpret_cast<const void*>(swiglu_forward_kernel), __ATOMIC_RELAXED);
  return launch_current(a->x.data, nullptr, a->out.data, a->N, a->H, a->x.dtype, stream);
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  using namespace hv8;
  if (!known_dtype(a->x.dtype)) return cudaErrorInvalidValue;
  __atomic_store_n(&g_kernel, reinterpret_cast<const void*>(swiglu_backward_kernel), __ATOMIC_RELAXED);
  return launch_current(a->x.data, a->grad_out.data, a->grad_x.data, a->N, a->H, a->x.dtype, stream);
}
