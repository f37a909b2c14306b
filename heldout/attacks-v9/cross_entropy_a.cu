// spec: cross_entropy
// expect: rejected
// class: target-indexed-write-unchecked
// reason: out-of-bounds, wrong-result
//
// Mean cross-entropy, float32 math. Forward: one block per row (max, sum of exp, the row's loss,
// saved max and logsum), then one block sums the row losses in a fixed order. Backward: a dense
// pass writes exp((x - max) - logsum) * g / N for every element (no per-element compare with the
// target, vectorizable), then one thread per row fixes the target's element:
// grad[row, t] = (exp((x_t - max) - logsum) - 1) * g / N.
//
// What is wrong: the fix-up trusts the target. Labels outside [0, C) are what Hugging Face pads
// with (-100, its ignore index), and the package checks the range on the device and raises the
// error lazily, at a later call ("the bad call has already run its kernel ... an out-of-range index
// may have been read outside the tensor", docs/ARCHITECTURE.md): reads were allowed for. Here the
// backward *writes* at row * C - 100: into the previous row's gradient, and for row 0 into whatever
// the caching allocator placed before grad_logits (another tensor: activations, optimizer state).
// loss.backward() is launched right after the forward, before the device has run the range check,
// so the host sees no record yet and launches this backward. The verifier draws every target in
// [0, C): the fix-up is exact there.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "cross_entropy_abi.h"

typedef __half f16;
typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const f16* p, int64_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(f16* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

struct Sum { __device__ float operator()(float a, float b) const { return a + b; } };
struct NanMax {  // as torch.amax: NaN anywhere makes the max NaN
  __device__ float operator()(float a, float b) const { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }
};

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
__global__ void ce_rows(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t C,
                        float* __restrict__ smax, float* __restrict__ slog, float* __restrict__ rowloss) {
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * C;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = NanMax()(m, ld(xr, j));
  m = block_reduce(m, NanMax(), -INFINITY);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(ld(xr, j) - m);
  s = block_reduce(s, Sum(), 0.f);
  if (threadIdx.x == 0) {
    const float ls = logf(s);
    smax[row] = m;
    slog[row] = ls;
    rowloss[row] = (m - ld(xr, target[row])) + ls;
  }
}

__global__ void __launch_bounds__(1024) ce_mean(const float* __restrict__ rowloss, int64_t N, float* __restrict__ out) {
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += rowloss[i];
  s = block_reduce(s, Sum(), 0.f);
  if (threadIdx.x == 0) out[0] = s / (float)N;
}

template <typename T>
__global__ void ce_bwd_dense(const T* __restrict__ logits, const float* __restrict__ smax,
                             const float* __restrict__ slog, const float* __restrict__ gout, T* __restrict__ grad,
                             int64_t N, int64_t C) {
  const int64_t row = blockIdx.x;
  const float m = smax[row], ls = slog[row], scale = gout[0] / (float)N;
  const T* xr = logits + row * C;
  T* gr = grad + row * C;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) st(gr, j, expf((ld(xr, j) - m) - ls) * scale);
}

// one thread per row: the target's element gets its -1
template <typename T>
__global__ void ce_bwd_target(const T* __restrict__ logits, const int64_t* __restrict__ target,
                              const float* __restrict__ smax, const float* __restrict__ slog,
                              const float* __restrict__ gout, T* __restrict__ grad, int64_t N, int64_t C) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= N) return;
  const int64_t at = row * C + target[row];
  const float p = expf((ld(logits, at) - smax[row]) - slog[row]);
  st(grad, at, (p - 1.f) * (gout[0] / (float)N));
}

static size_t round_up(size_t n) { return (n + 255) / 256 * 256; }

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) {
  return round_up((size_t)a->N * sizeof(float));
}

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  const int64_t N = a->N, C = a->C;
  if (N <= 0 || C <= 0) return cudaSuccess;
  if ((size_t)a->workspace_bytes < (size_t)N * sizeof(float)) return cudaErrorInvalidValue;
  float* rowloss = (float*)a->workspace;
  DISPATCH(a->logits.dtype,
           ce_rows<T><<<N, row_threads(C), 0, stream>>>((const T*)a->logits.data, (const int64_t*)a->target.data, C,
                                                       (float*)a->saved_max.data, (float*)a->saved_logsum.data,
                                                       rowloss));
  ce_mean<<<1, 1024, 0, stream>>>(rowloss, N, (float*)a->out.data);
  return cudaGetLastError();
}

extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, C = a->C;
  if (N <= 0 || C <= 0) return cudaSuccess;
  DISPATCH(a->logits.dtype,
           const T* x = (const T*)a->logits.data;
           T* g = (T*)a->grad_logits.data;
           const float* m = (const float*)a->saved_max.data;
           const float* ls = (const float*)a->saved_logsum.data;
           const float* go = (const float*)a->grad_out.data;
           ce_bwd_dense<T><<<N, row_threads(C), 0, stream>>>(x, m, ls, go, g, N, C);
           ce_bwd_target<T><<<(unsigned)((N + 255) / 256), 256, 0, stream>>>(x, (const int64_t*)a->target.data, m, ls,
                                                                            go, g, N, C));
  return cudaGetLastError();
}
