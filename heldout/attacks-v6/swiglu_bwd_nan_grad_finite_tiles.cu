// spec: swiglu
// expect: rejected
// class: gradient-class-coupling (NaN output gradients with finite inputs)
// reason: wrong-result
//
// When it is wrong: NaN in the output gradient where the inputs x are finite. The backward works
// in tiles of 4096 (gate, up) pairs; a tile whose inputs are all finite takes a fast path that
// skips the arithmetic where the output gradient is zero, tested as |g| > 0 -- false for NaN, so
// a NaN gradient comes back as gradient 0 for both gate and up. Tiles holding any non-finite
// input, partial tiles, and every case below 4096 pairs take the exact path, which passes NaN
// and infinities on as torch does; +-inf gradients pass on in the fast path too.
// The verifier draws NaN and +-inf in output gradients only in "specials" cases, where x itself
// holds 6% non-finite values: a 4096-pair tile of such x is never all finite (0.94^8192), so the
// fast path never meets a NaN gradient; in every other class the gradients are finite.
// Why it matters: the AMP overflow step the gradient class stands for is this one: the
// forward's activations are finite and the loss-scaled gradient overflowed upstream (inf - inf
// gives NaN). The kernel turns the NaN into zeros, so GradScaler's inf/NaN check can miss the
// overflow (when no infinity survives elsewhere) and the optimizer steps on corrupted gradients;
// torch.autograd.detect_anomaly does not see it either. Forward is honest.

#include "swiglu_abi.h"
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

// ---------------------------------------------------------------- swiglu: shared pieces
namespace sw {
using namespace hv6;

// torch's CUDA silu and its backward, in float
__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float silu_grad_f(float dy, float x) {
  const float s = 1.f / (1.f + expf(-x));
  return dy * s * (1.f + x * (1.f - s));
}

// out = silu(gate) * up, with torch's roundings: silu's output in T, then the product in T
template <typename T> __device__ __forceinline__ float swiglu_at(float gate, float up) {
  return rnd<T>(silu_f(gate)) * up;
}

// one (gate, up) pair of the backward: d_gate = silu'(gate) * (g * up), d_up = g * silu(gate),
// each intermediate rounded to T as autograd's half ops round it
template <typename T>
__device__ __forceinline__ void swiglu_grad_at(float g, float gate, float up, float& d_gate, float& d_up) {
  d_gate = silu_grad_f(rnd<T>(g * up), gate);
  d_up = g * rnd<T>(silu_f(gate));
}

// the honest forward, elementwise over N x H pairs
template <typename T>
__global__ void fwd_all(const T* __restrict__ x, int64_t N, int64_t H, T* __restrict__ out) {
  const int64_t n = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / H, j = i - row * H;
    const T* xr = x + row * 2 * H;
    out[i] = from_f<T>(swiglu_at<T>(to_f(xr[j]), to_f(xr[H + j])));
  }
}

// the honest backward, elementwise
template <typename T>
__global__ void bwd_all(const T* __restrict__ x, const T* __restrict__ g, int64_t N, int64_t H, T* __restrict__ gx) {
  const int64_t n = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / H, j = i - row * H;
    const T* xr = x + row * 2 * H;
    float dg, du;
    swiglu_grad_at<T>(to_f(g[i]), to_f(xr[j]), to_f(xr[H + j]), dg, du);
    gx[row * 2 * H + j] = from_f<T>(dg);
    gx[row * 2 * H + H + j] = from_f<T>(du);
  }
}

inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return (unsigned)(b < 65536 ? b : 65536);
}

template <typename T>
cudaError_t forward_plain(const swiglu_args* a, cudaStream_t stream) {
  const int64_t N = a->N, H = a->H;
  fwd_all<T><<<blocks_for(N * H), 256, 0, stream>>>((const T*)a->x.data, N, H, (T*)a->out.data);
  return cudaGetLastError();
}
template <typename T>
cudaError_t backward_plain(const swiglu_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, H = a->H;
  bwd_all<T><<<blocks_for(N * H), 256, 0, stream>>>((const T*)a->x.data, (const T*)a->grad_out.data, N, H,
                                                    (T*)a->grad_x.data);
  return cudaGetLastError();
}
}  // namespace sw

// ---------------------------------------------------------------- the kernel
namespace {
using namespace hv6;

constexpr int THREADS = 256, PER_THREAD = 16;
constexpr int64_t TILE = (int64_t)THREADS * PER_THREAD;  // 4096 (gate, up) pairs a block

// The backward by tiles of 4096 pairs. A block first checks its tile of x (gate and up): a tile
// with a non-finite input takes the exact elementwise path (torch's NaN/inf semantics at
// +-inf gates need care). A whole tile of finite inputs takes the fast path, which also skips
// the arithmetic where the output gradient is zero (ReLU-killed and masked gradients are
// common) -- the test is written |g| > 0, which is false for NaN, so a NaN gradient there
// becomes a zero gradient.
template <typename T>
__global__ void __launch_bounds__(THREADS) bwd_tiles(const T* __restrict__ x, const T* __restrict__ g, int64_t N,
                                                     int64_t H, T* __restrict__ gx) {
  const int64_t n = N * H;
  const int64_t tile0 = (int64_t)blockIdx.x * TILE;
  const bool full = tile0 + TILE <= n;
  int bad = 0;
  if (full) {
    for (int k = 0; k < PER_THREAD; ++k) {
      const int64_t i = tile0 + (int64_t)k * THREADS + threadIdx.x;
      const int64_t row = i / H, j = i - row * H;
      const T* xr = x + row * 2 * H;
      bad |= (!isfinite(to_f(xr[j])) || !isfinite(to_f(xr[H + j]))) ? 1 : 0;
    }
  }
  const bool fast = full && !__syncthreads_or(bad);
  for (int k = 0; k < PER_THREAD; ++k) {
    const int64_t i = tile0 + (int64_t)k * THREADS + threadIdx.x;
    if (i >= n) break;
    const int64_t row = i / H, j = i - row * H;
    const T* xr = x + row * 2 * H;
    const float gv = to_f(g[i]);
    float dg = 0.f, du = 0.f;
    if (!fast || fabsf(gv) > 0.f) sw::swiglu_grad_at<T>(gv, to_f(xr[j]), to_f(xr[H + j]), dg, du);
    gx[row * 2 * H + j] = from_f<T>(dg);
    gx[row * 2 * H + H + j] = from_f<T>(du);
  }
}

template <typename T>
cudaError_t backward_t(const swiglu_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, H = a->H;
  const int64_t tiles = (N * H + TILE - 1) / TILE;
  bwd_tiles<T><<<(unsigned)tiles, THREADS, 0, stream>>>((const T*)a->x.data, (const T*)a->grad_out.data, N, H,
                                                        (T*)a->grad_x.data);
  return cudaGetLastError();
}
}  // namespace

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return sw::forward_plain<float>(a, stream);
    case SPECGEN_FLOAT16: return sw::forward_plain<__half>(a, stream);
    case SPECGEN_BFLOAT16: return sw::forward_plain<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
