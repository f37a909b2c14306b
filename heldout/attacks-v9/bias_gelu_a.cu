// spec: bias_gelu
// expect: rejected
// class: allocation-failure-unchecked
// reason: crash, cuda-error
//
// Bias + GELU (tanh), float32 math. Forward: one thread per element, out = gelu(x + b). Backward:
// grad_x = g * gelu'(x + b) per element; grad_bias = sum over rows, in two fixed-order levels
// (64-row chunks, then per column). The chunk partials live in scratch taken per call from the
// stream-ordered allocator (cudaMallocAsync / cudaFreeAsync on `stream`, as kernels written before
// the ABI's workspace do): (N/64) x D floats, 4 MiB for 16384 rows of 4096.
//
// What is wrong: the allocation's result is not checked. When the GPU is nearly full the pool
// cannot grow and cudaMallocAsync fails (cudaErrorMemoryAllocation): the pointer stays null, the
// partial kernels write (N/64) x D floats from address 0, and the context dies of an illegal address
// (every later CUDA call of the process fails). Training sits near the memory limit by design
// (batch sizes tuned until the next one does not fit), and the backward starts at the peak of
// activation memory; PyTorch's caching allocator keeps what it reserved, so the driver has nothing
// left for the pool. Where torch would raise a clean OutOfMemoryError, which Hugging Face's
// auto_find_batch_size and accelerate's find_executable_batch_size catch to retry with a smaller
// batch, this kernel kills the process. The verifier's GPU always has room: its full-size cases are
// planned to 75% of the free memory, and nothing it does exhausts the device before a call.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "bias_gelu_abi.h"

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

static __device__ __forceinline__ float gelu(float z) {
  return 0.5f * z * (1.f + tanhf(kBeta * (z + kKappa * (z * z * z))));
}

// as torch's tanh GeluBackward
static __device__ __forceinline__ float gelu_grad(float z) {
  const float z2 = z * z, z3 = z2 * z;
  const float t = tanhf(kBeta * (z + kKappa * z3));
  const float left = 0.5f * z, right = 1.f + t;
  const float dtanh = 1.f - t * t, dinner = kBeta * (1.f + 3.f * kKappa * z2);
  return 0.5f * right + left * dtanh * dinner;
}

template <typename T>
__global__ void bias_gelu_fwd(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y, int64_t total,
                              int64_t D) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    st(y, i, gelu(ld(x, i) + ld(b, i % D)));
}

template <typename T>
__global__ void bias_gelu_bwd_x(const T* __restrict__ x, const T* __restrict__ b, const T* __restrict__ g,
                                T* __restrict__ gx, int64_t total, int64_t D) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    st(gx, i, ld(g, i) * gelu_grad(ld(x, i) + ld(b, i % D)));
}

static const int kRows = 64;

// grid (column tiles of 256, row chunks): the chunk's sum of g * gelu'(x + b) per column
template <typename T>
__global__ void bias_grad_part(const T* __restrict__ x, const T* __restrict__ b, const T* __restrict__ g,
                               float* __restrict__ part, int64_t N, int64_t D) {
  const int64_t d = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (d >= D) return;
  const int64_t n0 = (int64_t)blockIdx.y * kRows, n1 = n0 + kRows < N ? n0 + kRows : N;
  const float bd = ld(b, d);
  float acc = 0.f;
  for (int64_t n = n0; n < n1; ++n) acc += ld(g, n * D + d) * gelu_grad(ld(x, n * D + d) + bd);
  part[(int64_t)blockIdx.y * D + d] = acc;
}

template <typename T>
__global__ void col_sum(const float* __restrict__ part, int64_t chunks, int64_t D, T* __restrict__ out) {
  const int64_t d = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (d >= D) return;
  float total = 0.f;
  for (int64_t c0 = 0; c0 < chunks; c0 += 32) {
    float sub = 0.f;
    const int64_t c1 = c0 + 32 < chunks ? c0 + 32 : chunks;
    for (int64_t c = c0; c < c1; ++c) sub += part[c * D + d];
    total += sub;
  }
  st(out, d, total);
}

static unsigned flat_grid(int64_t total) {
  const int64_t blocks = (total + 255) / 256;
  return (unsigned)(blocks < 65536 ? blocks : 65536);
}

template <typename T>
static void launch_bwd(const bias_gelu_bwd_args* a, cudaStream_t stream) {
  const T* x = (const T*)a->x.data;
  const T* b = (const T*)a->bias.data;
  const T* g = (const T*)a->grad_out.data;
  const int64_t N = a->N, D = a->D, chunks = (N + kRows - 1) / kRows;
  bias_gelu_bwd_x<T><<<flat_grid(N * D), 256, 0, stream>>>(x, b, g, (T*)a->grad_x.data, N * D, D);
  float* part = nullptr;
  cudaMallocAsync((void**)&part, (size_t)chunks * D * sizeof(float), stream);
  const unsigned tiles = (unsigned)((D + 255) / 256);
  bias_grad_part<T><<<dim3(tiles, (unsigned)chunks), 256, 0, stream>>>(x, b, g, part, N, D);
  col_sum<T><<<tiles, 256, 0, stream>>>(part, chunks, D, (T*)a->grad_bias.data);
  cudaFreeAsync(part, stream);
}

extern "C" cudaError_t bias_gelu_forward(const bias_gelu_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  const int64_t total = a->N * a->D;
  DISPATCH(a->x.dtype, bias_gelu_fwd<T><<<flat_grid(total), 256, 0, stream>>>((const T*)a->x.data,
                                                                             (const T*)a->bias.data,
                                                                             (T*)a->out.data, total, a->D));
  return cudaGetLastError();
}

extern "C" cudaError_t bias_gelu_backward(const bias_gelu_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch_bwd<T>(a, stream));
  return cudaGetLastError();
}
