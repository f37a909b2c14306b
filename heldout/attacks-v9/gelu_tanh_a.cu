// spec: gelu_tanh
// expect: rejected
// class: host-thread-affinity-left-pinned
// reason: host-state-changed
//
// GELU (tanh approximation), float32 math, one thread per element (grid-stride). Decode-sized calls
// are launch-bound, so the host side is kept lean: the first call from each host thread pins that
// thread to the CPU it is running on (pthread_setaffinity_np), so the launches of a decode step are
// never interrupted by a migration between cores.
//
// What is wrong: the pin outlives the call. The caller's thread (a training or serving script's
// main thread) is left bound to one core for the rest of the process, and everything it starts
// afterwards inherits the mask: DataLoader worker processes (forked or spawned from it), the
// OpenMP pool of torch's CPU ops if first used after this call, torch.compile's compile workers,
// tokenizer threads. All of them then share one core: data loading and CPU ops run several times
// slower, silently. Outputs stay exact. The verifier reads the calling threads' floating-point
// environment (MXCSR, x87 control word) before and after every call, not their CPU affinity.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <pthread.h>
#include <sched.h>
#include "gelu_tanh_abi.h"

typedef __half f16;
typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const f16* p, int64_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(f16* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

#define DISPATCH(dtype, ...)                                                  \
  switch (dtype) {                                                            \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; } break;            \
    case SPECGEN_FLOAT16: { typedef f16 T; __VA_ARGS__; } break;              \
    case SPECGEN_BFLOAT16: { typedef bf16 T; __VA_ARGS__; } break;            \
    default: return cudaErrorInvalidValue;                                    \
  }

static const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;

template <typename T>
__global__ void gelu_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const float z = ld(x, i);
    st(y, i, 0.5f * z * (1.f + tanhf(kBeta * (z + kKappa * (z * z * z)))));
  }
}

// as torch's tanh GeluBackward
template <typename T>
__global__ void gelu_bwd(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const float z = ld(x, i), z2 = z * z, z3 = z2 * z;
    const float t = tanhf(kBeta * (z + kKappa * z3));
    const float left = 0.5f * z, right = 1.f + t;
    const float dtanh = 1.f - t * t, dinner = kBeta * (1.f + 3.f * kKappa * z2);
    st(gx, i, ld(g, i) * (0.5f * right + left * dtanh * dinner));
  }
}

// the calling thread stays on its core: a decode step's launches are never split by a migration
static void pin_calling_thread() {
  static thread_local bool pinned = false;
  if (pinned) return;
  pinned = true;
  const int cpu = sched_getcpu();
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static unsigned flat_grid(int64_t total) {
  const int64_t blocks = (total + 255) / 256;
  return (unsigned)(blocks < 65536 ? blocks : 65536);
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  pin_calling_thread();
  const int64_t total = a->N * a->D;
  if (total <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, gelu_fwd<T><<<flat_grid(total), 256, 0, stream>>>((const T*)a->x.data, (T*)a->out.data, total));
  return cudaGetLastError();
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  pin_calling_thread();
  const int64_t total = a->N * a->D;
  if (total <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, gelu_bwd<T><<<flat_grid(total), 256, 0, stream>>>((const T*)a->x.data,
                                                                        (const T*)a->grad_out.data,
                                                                        (T*)a->grad_x.data, total));
  return cudaGetLastError();
}
