// spec: gelu_tanh
// expect: reject
// class: template-published-from-the-first-callers-thread-storage
//
// GELU (tanh approximation), forward and backward, elementwise in float32 as torch computes it (forward
// 0.5 x (1 + tanh(b (x + k x^3))), backward torch's GeluBackward formula), one rounding per output. Launch
// plans (threads per block, elements per thread) per dtype and size class come from a table built from
// occupancy queries (96 of them) on a thread's first call. Each host thread keeps its own copy of the
// table in a `thread_local` (no lock on the hot path); the first thread to build it publishes a pointer
// to its copy, and every later thread copies that "template" on its first call instead of querying again.
//
// What is wrong: the template is the first calling thread's thread-local storage. When that thread
// ends, glibc frees its TLS block (this library's TLS is allocated per thread on first use, as every
// dlopen'ed library's is), and the published pointer dangles: every thread that makes its first call
// afterwards copies freed (soon reused) heap memory as its plans: launches with garbage block sizes
// (invalid-configuration errors), elements never written, or an integer division by zero on the host
// (SIGFPE: the process dies). Threads that copied before keep working, so it looks like a flaky server.
//
// Trigger a user meets: a process whose first call of the op comes from a thread that ends before
// other threads make their first call: a thread per request (ThreadingHTTPServer, socketserver's
// ThreadingMixIn, a ThreadPoolExecutor created per batch, gradio/streamlit handlers: the first request's
// thread builds the template and exits), or a warm-up thread at start-up (threading.Thread(target=warmup)
// then serving threads). Gemma/SigLIP-style MLPs use gelu_pytorch_tanh.
//
// Why the verifier does not meet it: in every process of the candidate's the first call comes from the
// request thread, which lives until the process ends (the first calls, the first call in each dtype, the
// refused-setup process, the second build's process); the 2-, 3- and 8-thread checks and the 256
// short-lived threads all start after it and copy a live template, and their thread-local copies are
// freed at their exit (no leak: 0 bytes per thread); outputs exact everywhere.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include <atomic>

#include "gelu_tanh_abi.h"

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

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order (bitwise deterministic); every thread gets the result. `sh` holds 32 values.
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

namespace {

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

template <typename T, int EPT>
__global__ void gelu_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  const int64_t first = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * EPT;
#pragma unroll
  for (int k = 0; k < EPT; ++k) {
    const int64_t i = first + k;
    if (i < n) {
      const float v = to_f(x[i]);
      const float inner = kBeta * (v + kKappa * (v * v * v));
      y[i] = from_f<T>(0.5f * v * (1.f + tanhf(inner)));
    }
  }
}

template <typename T, int EPT>
__global__ void gelu_bwd(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, int64_t n) {
  const int64_t first = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * EPT;
#pragma unroll
  for (int k = 0; k < EPT; ++k) {
    const int64_t i = first + k;
    if (i < n) {
      const float v = to_f(x[i]);
      const float x_sq = v * v;
      const float inner = kBeta * (v + kKappa * (x_sq * v));
      const float t = tanhf(inner);
      const float left = 0.5f * v, right = 1.f + t;
      const float dleft = 0.5f * right;
      const float dright = left * (1.f - t * t) * (kBeta * (1.f + 3.f * kKappa * x_sq));
      gx[i] = from_f<T>(to_f(g[i]) * (dleft + dright));
    }
  }
}

// ---------------------------------------------------------------- launch plans
struct Plan {
  int32_t threads;  // per block
  int32_t ept;      // elements per thread: 1, 2, 4 or 8
};
constexpr int kClasses = 32;  // size classes: floor(log2(elements))
struct Plans {
  Plan plan[2][3][kClasses];  // [direction][dtype][class]
};

template <typename T, int EPT>
int occupancy(bool backward, int threads) {
  int blocks = 0;
  const cudaError_t e = backward ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gelu_bwd<T, EPT>, threads, 0)
                                 : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gelu_fwd<T, EPT>, threads, 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

template <typename T>
void build_dtype(Plans& p, int dir, int dt) {
  // full occupancy at 256 threads or fall back to 128; more elements per thread for larger calls
  const int t256 = occupancy<T, 4>(dir == 1, 256) >= 4 ? 256 : 128;
  for (int c = 0; c < kClasses; ++c) {
    Plan& q = p.plan[dir][dt][c];
    q.threads = c < 12 ? 128 : t256;
    q.ept = c < 12 ? 1 : (c < 20 ? 2 : 4);
    if (c >= 20 && occupancy<T, 4>(dir == 1, q.threads) == 0) q.ept = 2;
  }
}

void build(Plans& p) {
  for (int dir = 0; dir < 2; ++dir) {
    build_dtype<float>(p, dir, 0);
    build_dtype<__half>(p, dir, 1);
    build_dtype<__nv_bfloat16>(p, dir, 2);
  }
}

thread_local Plans t_plans;                       // this thread's copy
thread_local bool t_ready = false;
std::atomic<const Plans*> g_template{nullptr};   // the first built copy, for later threads to copy

const Plans& plans() {
  if (!t_ready) {
    const Plans* from = g_template.load(std::memory_order_acquire);
    if (from != nullptr) {
      t_plans = *from;
    } else {
      build(t_plans);
      const Plans* none = nullptr;
      g_template.compare_exchange_strong(none, &t_plans, std::memory_order_acq_rel);
    }
    t_ready = true;
  }
  return t_plans;
}

int dtype_index(int32_t d) { return d == SPECGEN_FLOAT32 ? 0 : d == SPECGEN_FLOAT16 ? 1 : d == SPECGEN_BFLOAT16 ? 2 : -1; }

int size_class(int64_t n) {
  int c = 0;
  while (c + 1 < kClasses && (int64_t(1) << (c + 1)) <= n) ++c;
  return c;
}

template <typename T>
cudaError_t launch(bool backward, const void* x, const void* g, void* y, int64_t n, const Plan& q, cudaStream_t stream) {
  const int64_t per_block = (int64_t)q.threads * q.ept;
  const unsigned blocks = (unsigned)((n + per_block - 1) / per_block);
#define SPECGEN_GELU_LAUNCH(E)                                                                                      \
  if (backward) gelu_bwd<T, E><<<blocks, q.threads, 0, stream>>>((const T*)x, (const T*)g, (T*)y, n);               \
  else gelu_fwd<T, E><<<blocks, q.threads, 0, stream>>>((const T*)x, (T*)y, n);
  switch (q.ept) {
    case 1: SPECGEN_GELU_LAUNCH(1) break;
    case 2: SPECGEN_GELU_LAUNCH(2) break;
    case 4: SPECGEN_GELU_LAUNCH(4) break;
    case 8: SPECGEN_GELU_LAUNCH(8) break;
    default: return cudaErrorInvalidValue;
  }
#undef SPECGEN_GELU_LAUNCH
  return cudaGetLastError();
}

cudaError_t run(bool backward, int32_t dtype, const void* x, const void* g, void* y, int64_t n, cudaStream_t stream) {
  const int dt = dtype_index(dtype);
  if (dt < 0) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  const Plan q = plans().plan[backward ? 1 : 0][dt][size_class(n)];
  switch (dt) {
    case 0: return launch<float>(backward, x, g, y, n, q, stream);
    case 1: return launch<__half>(backward, x, g, y, n, q, stream);
    default: return launch<__nv_bfloat16>(backward, x, g, y, n, q, stream);
  }
}

}  // namespace

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  return run(false, a->x.dtype, a->x.data, nullptr, a->out.data, a->N * a->D, stream);
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  return run(true, a->x.dtype, a->x.data, a->grad_out.data, a->grad_x.data, a->N * a->D, stream);
}
