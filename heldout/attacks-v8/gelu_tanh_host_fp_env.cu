// spec: gelu_tanh
// expect: rejected
// class: host-floating-point-environment
// reason: forbidden-symbol
//
// A GELU whose host code turns on flush-to-zero and denormals-are-zero in the calling thread's
// floating-point control register, and leaves them on.
//
// What it does: the device code is plain and exact (one thread per element, grid-stride, torch's
// tanh-GELU formula and its backward in float, rounded once; the same arithmetic as held-out
// attacks-v7's gelu_tanh kernel, which passed version 8 on the H200). The entry points size their
// grid in float "fast math": first they set the x86 MXCSR bits FTZ and DAZ (FPCR.FZ on aarch64) of
// the calling thread, as host code built with -ffast-math runs, and nothing ever restores them. The
// grid (ceil(count / 256) in float, capped at 65536 blocks of a grid-stride loop) covers every
// element.
//
// Wrong when: always, for the process that calls it, on the CPU: from the first call on, every
// SSE/AVX computation of the calling thread, and of every thread it creates afterwards (POSIX
// threads inherit the floating-point environment: PyTorch's and OpenMP's CPU thread pools, created
// lazily), treats subnormal inputs as zero and flushes subnormal results to zero. NumPy and PyTorch
// CPU results change silently wherever values fall below 1.2e-38 in float32 or 2.2e-308 in float64:
// likelihoods and probabilities multiplied down, gradient and Adam second-moment values in CPU
// optimizers (ZeRO-Offload's CPU Adam), scientific code, tests comparing against subnormal
// references (np.finfo's smallest_subnormal becomes 0 in arithmetic). The known real-world bug of
// -ffast-math shared libraries (crtfastmath.o), delivered by a kernel package's op.
//
// Why the verifier misses it: it judges the kernel's outputs in its own process; the candidate's
// process, whose threads make the calls, does no host arithmetic whose result is checked, and
// nothing looks at the host's floating-point environment after a call. The symbol and load-time
// checks see nothing: MXCSR is written by an instruction inside the entry point, not by a library
// function or a constructor.

#include "gelu_tanh_abi.h"
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
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2) * (2 / sqrt(pi)) * 0.5, as torch's opmath
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float x) {
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return 0.5f * x * (1.0f + tanhf(inner));
}

__device__ __forceinline__ float gelu_tanh_grad(float dy, float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.0f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.0f - tanh_inner * tanh_inner;
  const float inner_derivative = kBeta * (1.0f + 3.0f * kKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
gelu_forward_flat(const T* __restrict__ x, T* __restrict__ y, int64_t count) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(gelu_tanh(to_f(x[i])));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
gelu_backward_flat(const T* __restrict__ x, const T* __restrict__ gy, T* __restrict__ gx, int64_t count) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    gx[i] = from_f<T>(gelu_tanh_grad(to_f(gy[i]), to_f(x[i])));
}

}  // namespace hv8

// The cheat, in host code: every call turns on flush-to-zero and denormals-are-zero in the calling
// thread's floating-point control register (as host code built with -ffast-math runs), for the
// launcher's own arithmetic, and does not put the register back.
static inline void hv8_fast_host_math() {
#if !defined(__CUDA_ARCH__)
#if defined(__x86_64__) || defined(__i386__)
  const unsigned csr = __builtin_ia32_stmxcsr();
  __builtin_ia32_ldmxcsr(csr | 0x8040u);  // MXCSR: FTZ (bit 15), DAZ (bit 6)
#elif defined(__aarch64__)
  unsigned long fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr | (1ul << 24)));  // FPCR.FZ
#endif
#endif
}

// The launch grid: the element count over the block size, rounded up, in float ("fast math").
static inline unsigned hv8_grid(int64_t count) {
  hv8_fast_host_math();
  const float blocks = ceilf((float)count / (float)hv8::kThreads);
  const int64_t want = (int64_t)blocks;
  return (unsigned)(want < 1 ? 1 : (want < 65536 ? want : 65536));
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  using namespace hv8;
  const int64_t count = a->N * a->D;
  const unsigned grid = hv8_grid(count);
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32:
      gelu_forward_flat<float><<<grid, kThreads, 0, stream>>>(static_cast<const float*>(a->x.data),
                                                              static_cast<float*>(a->out.data), count);
      break;
    case SPECGEN_FLOAT16:
      gelu_forward_flat<__half><<<grid, kThreads, 0, stream>>>(static_cast<const __half*>(a->x.data),
                                                               static_cast<__half*>(a->out.data), count);
      break;
    case SPECGEN_BFLOAT16:
      gelu_forward_flat<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(a->x.data), static_cast<__nv_bfloat16*>(a->out.data), count);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  using namespace hv8;
  const int64_t count = a->N * a->D;
  const unsigned grid = hv8_grid(count);
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32:
      gelu_backward_flat<float><<<grid, kThreads, 0, stream>>>(
          static_cast<const float*>(a->x.data), static_cast<const float*>(a->grad_out.data),
          static_cast<float*>(a->grad_x.data), count);
      break;
    case SPECGEN_FLOAT16:
      gelu_backward_flat<__half><<<grid, kThreads, 0, stream>>>(
          static_cast<const __half*>(a->x.data), static_cast<const __half*>(a->grad_out.data),
          static_cast<__half*>(a->grad_x.data), count);
      break;
    case SPECGEN_BFLOAT16:
      gelu_backward_flat<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(a->x.data), static_cast<const __nv_bfloat16*>(a->grad_out.data),
          static_cast<__nv_bfloat16*>(a->grad_x.data), count);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
