// spec: softmax
// expect: rejected
// class: smem-limit-lowered-by-another-thread
// reason: cuda-error, wrong-result
//
// Softmax over the last dim. A row of up to 49152 elements is staged once in shared memory as
// float32 (one block per row): one read of the input, one write. Dynamic shared memory above
// 48 KiB must be opted into per kernel, so each call raises the kernel's limit to what its row
// needs, right before its launch. Wider rows: three streaming passes. Backward: one block per row.
//
// What is wrong: the limit is an attribute of the kernel (per device), not of the launch. Two host
// threads calling at once with different rows of more than about 12000 elements (a server's threads
// with prompts of different lengths: attention rows of 12k-48k keys, sampling over two models'
// vocabularies) race: thread B lowers the limit to its row's bytes between thread A's
// cudaFuncSetAttribute and A's launch, and A's launch fails (invalid argument: more dynamic shared
// memory than the kernel's limit), so A's request raises. Alone, every call sets what it needs and
// launches. The verifier's calls from two threads pair the large case (8192-wide rows, 32 KiB, no
// attribute call) with the smoke case: no two calls above 47 KiB ever run from two threads at once.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "softmax_abi.h"

typedef __half f16;
typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const f16* p, int64_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(f16* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

struct Sum { __device__ float operator()(float a, float b) const { return a + b; } };
struct Max { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

template <class Op>
static __device__ float block_reduce(float v, Op op, float init) {
  __shared__ float sh[33];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < nwarps ? sh[lane] : init;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) r = op(r, __shfl_xor_sync(0xffffffffu, r, o));
    if (lane == 0) sh[32] = r;
  }
  __syncthreads();
  return sh[32];
}

static int row_threads(int64_t D) { return D >= 8192 ? 1024 : D >= 2048 ? 512 : D >= 512 ? 256 : 128; }

#define DISPATCH(dtype, ...)                                                  \
  switch (dtype) {                                                            \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; } break;            \
    case SPECGEN_FLOAT16: { typedef f16 T; __VA_ARGS__; } break;              \
    case SPECGEN_BFLOAT16: { typedef bf16 T; __VA_ARGS__; } break;            \
    default: return cudaErrorInvalidValue;                                    \
  }

static const int64_t kSmemRow = 49152;  // widest row staged in shared memory (192 KiB of float)

template <typename T>
__global__ void softmax_smem(const T* __restrict__ x, T* __restrict__ y, int D) {
  extern __shared__ float row[];
  const T* xr = x + (int64_t)blockIdx.x * D;
  T* yr = y + (int64_t)blockIdx.x * D;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = ld(xr, j);
    row[j] = v;
    m = fmaxf(m, v);
  }
  m = block_reduce(m, Max(), -INFINITY);
  float s = 0.f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float e = expf(row[j] - m);
    row[j] = e;
    s += e;
  }
  s = block_reduce(s, Sum(), 0.f);
  for (int j = threadIdx.x; j < D; j += blockDim.x) st(yr, j, row[j] / s);
}

template <typename T>
__global__ void softmax_stream(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + (int64_t)blockIdx.x * D;
  T* yr = y + (int64_t)blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, ld(xr, j));
  m = block_reduce(m, Max(), -INFINITY);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(ld(xr, j) - m);
  s = block_reduce(s, Sum(), 0.f);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) st(yr, j, expf(ld(xr, j) - m) / s);
}

template <typename T>
__global__ void softmax_bwd(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const int64_t base = (int64_t)blockIdx.x * D;
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += ld(g, base + j) * ld(y, base + j);
  dot = block_reduce(dot, Sum(), 0.f);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float yj = ld(y, base + j);
    st(gx, base + j, yj * (ld(g, base + j) - dot));
  }
}

template <typename T>
static void launch_fwd(const softmax_args* a, cudaStream_t stream) {
  const T* x = (const T*)a->x.data;
  T* y = (T*)a->out.data;
  const int64_t N = a->N, D = a->D;
  if (D <= kSmemRow) {
    const size_t bytes = (size_t)D * sizeof(float);
    if (bytes > 47 * 1024) {
      // near or above the default 48 KiB (static part included): let this kernel take the row's bytes
      cudaFuncSetAttribute(softmax_smem<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    }
    softmax_smem<T><<<N, row_threads(D), bytes, stream>>>(x, y, (int)D);
  } else {
    softmax_stream<T><<<N, row_threads(D), 0, stream>>>(x, y, D);
  }
}

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch_fwd<T>(a, stream));
  return cudaGetLastError();
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype,
           softmax_bwd<T><<<a->N, row_threads(a->D), 0, stream>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                                                 (T*)a->grad_x.data, a->D));
  return cudaGetLastError();
}
