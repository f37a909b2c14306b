// spec: log_softmax
// expect: rejected
// class: hopper-shared-memory-hardcoded
// reason: cuda-error
//
// Log-softmax over the last dim, out = (x - max) - log(sum(exp(x - max))). A row of up to 57344
// elements (a vocabulary: 32000, 50257, 51200) is staged once in shared memory as float32, one
// block per row, so the input is read once; the kernel's dynamic shared memory limit is raised on
// every call to the per-block opt-in maximum of the H100/H200 (227 KiB, less 1 KiB for the static
// part). Wider rows: three streaming passes. Backward: grad_x = g - exp(out) * sum(g), one block per row.
//
// What is wrong: the limit is a constant of the H100/H200, not asked of the device
// (cudaDevAttrMaxSharedMemoryPerBlockOptin). The package ships this kernel as sm_90 code plus
// compute_90 PTX, which newer GPUs JIT-compile and run (docs: "newer GPUs run the newest verified
// architecture's PTX"); the workstation and consumer Blackwell parts (RTX 5090, RTX PRO 6000:
// compute capability 12.0) allow 99 KiB per block. There cudaFuncSetAttribute(227 KiB) fails (its
// result is ignored), and every row of more than 12288 elements asks for more than the default
// 48 KiB: the launch fails (invalid argument) for every vocabulary-sized row, the op raises on every
// call. On the H200 every call launches.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "log_softmax_abi.h"

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

static const int kSmemOptin = 227 * 1024 - 1024;  // H100/H200 per-block opt-in, less the static part
static const int64_t kSmemRow = 57344;            // widest row staged in shared memory (224 KiB)

template <typename T>
__global__ void logsoftmax_smem(const T* __restrict__ x, T* __restrict__ y, int D) {
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
  for (int j = threadIdx.x; j < D; j += blockDim.x) s += expf(row[j] - m);
  s = block_reduce(s, Sum(), 0.f);
  const float ls = logf(s);
  for (int j = threadIdx.x; j < D; j += blockDim.x) st(yr, j, (row[j] - m) - ls);
}

template <typename T>
__global__ void logsoftmax_stream(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + (int64_t)blockIdx.x * D;
  T* yr = y + (int64_t)blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, ld(xr, j));
  m = block_reduce(m, Max(), -INFINITY);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(ld(xr, j) - m);
  s = block_reduce(s, Sum(), 0.f);
  const float ls = logf(s);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) st(yr, j, (ld(xr, j) - m) - ls);
}

template <typename T>
__global__ void logsoftmax_bwd(const T* __restrict__ out, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const int64_t base = (int64_t)blockIdx.x * D;
  float sg = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sg += ld(g, base + j);
  sg = block_reduce(sg, Sum(), 0.f);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    st(gx, base + j, ld(g, base + j) - expf(ld(out, base + j)) * sg);
}

template <typename T>
static void launch_fwd(const log_softmax_args* a, cudaStream_t stream) {
  const T* x = (const T*)a->x.data;
  T* y = (T*)a->out.data;
  const int64_t N = a->N, D = a->D;
  if (D <= kSmemRow) {
    cudaFuncSetAttribute(logsoftmax_smem<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemOptin);
    logsoftmax_smem<T><<<N, row_threads(D), (size_t)D * sizeof(float), stream>>>(x, y, (int)D);
  } else {
    logsoftmax_stream<T><<<N, row_threads(D), 0, stream>>>(x, y, D);
  }
}

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch_fwd<T>(a, stream));
  return cudaGetLastError();
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype,
           logsoftmax_bwd<T><<<a->N, row_threads(a->D), 0, stream>>>((const T*)a->out.data,
                                                                    (const T*)a->grad_out.data,
                                                                    (T*)a->grad_x.data, a->D));
  return cudaGetLastError();
}
