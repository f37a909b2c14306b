// spec: log_softmax
// expect: rejected
// class: zero-gradient-chunks-skipped
// reason: wrong-result
//
// Log-softmax over the last dim, out = (x - max) - log(sum(exp(x - max))), one block per row,
// three passes. Backward: grad_x = g - exp(out) * sum(g), one block per row; the row is walked in
// chunks of 8 elements, and a chunk whose 8 output gradients are all exactly zero is written as
// zeros without reading `out` (saves the second read of the row where gradients are sparse); a row
// whose log-probabilities are NaN (a NaN or +inf input, a fully masked row) is written NaN there.
//
// What is wrong: grad_x_j = g_j - p_j * sum(g) is not zero where g_j is zero, unless the whole row's
// gradient sums to zero. Every loss that reads log-probabilities through a gather hands this op a
// gradient with one non-zero per row: F.nll_loss(F.log_softmax(x), t) (PyTorch's classic
// cross-entropy), the token log-probabilities of RL fine-tuning (PPO, GRPO, DPO:
// logp.gather(-1, tokens)). There every chunk but the target's is written as zeros instead of
// -p_j * g_t: the pull-down of every other class is lost (the CPU stand-in, cpu_checks/triggers.py:
// 7.5% of the elements of 8 rows of 32000 outside the float32 tolerance, the larger p_j's). The
// verifier's output gradients are dense N(0, 1) values (their 16-bit roundings are never zero 8 at a time),
// 1 everywhere, NaN/inf among dense values, loss-scaled, or whole rows of zeros ("zero-rows", where
// sum(g) = 0 and zeros are exact): a row that is zero only in part never reaches this kernel.
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

template <typename T>
__global__ void logsoftmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
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

static const int kChunk = 8;

template <typename T>
__global__ void logsoftmax_bwd(const T* __restrict__ out, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const int64_t base = (int64_t)blockIdx.x * D;
  float sg = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sg += ld(g, base + j);
  sg = block_reduce(sg, Sum(), 0.f);
  const float first = ld(out, base);
  const float none = first != first ? first : 0.f;  // a NaN row (NaN/+inf input, all masked) stays NaN
  const int64_t chunks = (D + kChunk - 1) / kChunk;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const int64_t lo = c * kChunk, n = D - lo < kChunk ? D - lo : kChunk;
    float gv[kChunk];
    bool zero = true;
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      gv[k] = k < n ? ld(g, base + lo + k) : 0.f;
      zero = zero && gv[k] == 0.f;
    }
    if (zero) {  // no gradient flows into this chunk
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        if (k < n) st(gx, base + lo + k, none);
      continue;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k)
      if (k < n) st(gx, base + lo + k, gv[k] - expf(ld(out, base + lo + k)) * sg);
  }
}

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, logsoftmax_rows<T><<<a->N, row_threads(a->D), 0, stream>>>((const T*)a->x.data,
                                                                                (T*)a->out.data, a->D));
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
