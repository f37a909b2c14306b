// spec: cross_entropy
// expect: rejected
// class: shapes-not-drawn (32-bit signed offsets between 2^31 and 2^32 elements)
// reason: crash, wrong-result, out-of-bounds
//
// When it is wrong: logits with more than 2^31 and at most 2^32 elements (N x C in
// (2147483648, 4294967295]). The kernel uses 32-bit offsets whenever N * C fits in 32 bits
// unsigned, but the offsets are int: row * C + col wraps negative past 2^31 - 1, so the forward
// reads (and the backward writes grad_logits) up to 8-16 GB before the tensor: an illegal
// address, another tensor's memory read as logits, or another tensor overwritten. Below 2^31
// elements the offsets are exact and every check passes. The verifier's largest cases hold
// exactly 2^31 elements (N=16384, C=131072 and N=65536, C=32768 in float32, the 10 GB cap),
// whose largest offset is 2^31 - 1; its odd and model-size twins are smaller. No case reaches
// the band.
// Why it matters: a language model's loss over a 128k vocabulary and a batch of 16k-32k tokens
// is in the band (Llama 3: 32768 x 128256 = 4.2e9 elements, 8.4 GB of bf16 logits on one
// H200). The backward then scribbles over whatever lives gigabytes below the logits.

#include "cross_entropy_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined)
namespace hv6 {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// the value a torch op in dtype T gives for a float result: rounded to T (and read back)
template <typename T> __device__ __forceinline__ float rnd(float v) { return to_f(from_f<T>(v)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_or(int v) { return __any_sync(0xffffffffu, v) ? 1 : 0; }

// Sum over the block (blockDim.x a multiple of 32, at most 1024), the same tree every call;
// every thread gets the result. `red` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = (threadIdx.x < warps) ? red[threadIdx.x] : 0.f;
  if (warp == 0) t = warp_sum(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}
__device__ __forceinline__ double block_sum_d(double v, double* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double t = (threadIdx.x < warps) ? red[threadIdx.x] : 0.0;
  if (warp == 0) t = warp_sum_d(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = (threadIdx.x < warps) ? red[threadIdx.x] : -INFINITY;
  if (warp == 0) t = warp_max(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  return red[0];
}

// Online (max, sum of exp) of a row, torch's semantics kept: NaN anywhere makes the sum NaN,
// +inf makes it NaN (exp(inf - inf)), -inf contributes 0, a row with no finite element keeps
// max = -inf (its outputs come out NaN, as torch's do).
struct MS { float m, s; };
__device__ __forceinline__ void ms_add(MS& a, float x) {
  if (x == -INFINITY) return;
  if (isnan(x)) { a.s = x; return; }
  const float m = fmaxf(a.m, x);
  a.s = a.s * expf(a.m - m) + expf(x - m);
  a.m = m;
}
// merging two partials; both empty (max -inf): still empty, NaN kept
__device__ __forceinline__ MS ms_merge(MS a, MS b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return MS{m, a.s + b.s};
  return MS{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ __forceinline__ MS warp_ms(MS a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MS b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
    a = ms_merge(a, b);
  }
  return a;
}
// over the block (same tree every call); `red` holds 64 floats of shared memory
__device__ __forceinline__ MS block_ms(MS a, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = warp_ms(a);
  __syncthreads();
  if (lane == 0) { red[warp] = a.m; red[32 + warp] = a.s; }
  __syncthreads();
  MS t{-INFINITY, 0.f};
  if (threadIdx.x < warps) t = MS{red[threadIdx.x], red[32 + threadIdx.x]};
  if (warp == 0) t = warp_ms(t);
  if (threadIdx.x == 0) { red[0] = t.m; red[32] = t.s; }
  __syncthreads();
  return MS{red[0], red[32]};
}

}  // namespace hv6

// ---------------------------------------------------------------- cross-entropy: shared pieces
namespace ce {
using namespace hv6;

// Offsets into logits: int64 here; the int32 variant of one attack instantiates Idx = int.
template <typename Idx> __device__ __forceinline__ Idx offset(int64_t row, int64_t C, int64_t col);
template <> __device__ __forceinline__ int64_t offset<int64_t>(int64_t row, int64_t C, int64_t col) {
  return row * C + col;
}
// 32-bit offsets: computed modulo 2^32 and read as a signed int (wraps negative past 2^31)
template <> __device__ __forceinline__ int offset<int>(int64_t row, int64_t C, int64_t col) {
  return (int)((unsigned)row * (unsigned)C + (unsigned)col);
}

// Per row: the loss term (max - x_t) + log(sum exp(x - max)) (torch's log_softmax, then NLL)
// into row_loss, and lse with torch.logsumexp's semantics into saved_lse (a max of +-inf is
// replaced by 0 before the subtraction: +inf rows give +inf, all -inf rows -inf, NaN gives NaN).
template <typename T, typename Idx>
__global__ void __launch_bounds__(512) row_terms(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                 int64_t C, float* __restrict__ lse_out,
                                                 float* __restrict__ row_loss) {
  __shared__ float red[64];
  __shared__ int any_nan_sh[32];
  const int64_t row = blockIdx.x;
  MS a{-INFINITY, 0.f};
  int nan_here = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const float v = to_f(logits[offset<Idx>(row, C, j)]);
    nan_here |= isnan(v) ? 1 : 0;
    ms_add(a, v);
  }
  a = block_ms(a, red);
  // any NaN in the row (a block OR)
  const int w = warp_or(nan_here);
  if ((threadIdx.x & 31) == 0) any_nan_sh[threadIdx.x >> 5] = w;
  __syncthreads();
  if (threadIdx.x == 0) {
    int any_nan = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) any_nan |= any_nan_sh[i];
    float lse;
    if (any_nan) lse = NAN;
    else if (a.m == INFINITY) lse = INFINITY;
    else if (a.m == -INFINITY) lse = -INFINITY;
    else lse = logf(a.s) + a.m;
    lse_out[row] = lse;
    const int64_t t = target[row];
    const float xt = to_f(logits[offset<Idx>(row, C, t)]);
    row_loss[row] = (a.m - xt) + logf(a.s);
  }
}

// the mean of the row terms, summed in double in a fixed order by one block
__global__ void __launch_bounds__(1024) mean_rows(const float* __restrict__ row_loss, int64_t N, float* __restrict__ out) {
  __shared__ double red[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += (double)row_loss[i];
  const double total = block_sum_d(acc, red);
  if (threadIdx.x == 0) out[0] = (float)(total / (double)N);
}

// backward: grad_logits = (g / N) * (softmax(x) - onehot(t)); the row's max and sum are
// computed again here (as torch's backward does from log_softmax), not taken from saved_lse
template <typename T, typename Idx>
__global__ void __launch_bounds__(512) bwd_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                                const float* __restrict__ grad_out, int64_t N, int64_t C,
                                                T* __restrict__ grad) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  MS a{-INFINITY, 0.f};
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) ms_add(a, to_f(logits[offset<Idx>(row, C, j)]));
  a = block_ms(a, red);
  const float scale = grad_out[0] / (float)N;
  const float logs = logf(a.s);
  const int64_t t = target[row];
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const Idx at = offset<Idx>(row, C, j);
    const float p = expf((to_f(logits[at]) - a.m) - logs);
    grad[at] = from_f<T>(j == t ? scale * p - scale : scale * p);
  }
}

inline size_t workspace_for(int64_t N) { return (size_t)N * sizeof(float) + 256; }
}  // namespace ce

extern "C" size_t cross_entropy_forward_workspace(const cross_entropy_args* a) { return ce::workspace_for(a->N); }

// ---------------------------------------------------------------- the kernel
namespace {
// 32-bit offsets are cheaper (fewer registers, 32-bit multiplies) and fit "any tensor of fewer
// than 2^32 elements" -- the guard is written against the unsigned limit, the offsets are int.
constexpr int64_t FITS_32_BITS = 0xFFFFFFFFll;

template <typename T, typename Idx>
cudaError_t forward_i(const cross_entropy_args* a, cudaStream_t stream) {
  const int64_t N = a->N, C = a->C;
  float* row_loss = (float*)a->workspace;
  ce::row_terms<T, Idx><<<(unsigned)N, 512, 0, stream>>>((const T*)a->logits.data, (const int64_t*)a->target.data,
                                                         C, (float*)a->saved_lse.data, row_loss);
  ce::mean_rows<<<1, 1024, 0, stream>>>(row_loss, N, (float*)a->out.data);
  return cudaGetLastError();
}
template <typename T>
cudaError_t forward_t(const cross_entropy_args* a, cudaStream_t stream) {
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < ce::workspace_for(a->N)) return cudaErrorInvalidValue;
  return a->N * a->C <= FITS_32_BITS ? forward_i<T, int>(a, stream) : forward_i<T, int64_t>(a, stream);
}

template <typename T, typename Idx>
cudaError_t backward_i(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  ce::bwd_rows<T, Idx><<<(unsigned)a->N, 512, 0, stream>>>((const T*)a->logits.data, (const int64_t*)a->target.data,
                                                          (const float*)a->grad_out.data, a->N, a->C,
                                                          (T*)a->grad_logits.data);
  return cudaGetLastError();
}
template <typename T>
cudaError_t backward_t(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  return a->N * a->C <= FITS_32_BITS ? backward_i<T, int>(a, stream) : backward_i<T, int64_t>(a, stream);
}
}  // namespace

extern "C" cudaError_t cross_entropy_forward(const cross_entropy_args* a, cudaStream_t stream) {
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
extern "C" cudaError_t cross_entropy_backward(const cross_entropy_bwd_args* a, cudaStream_t stream) {
  switch (a->logits.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
