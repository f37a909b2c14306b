// spec: swiglu
// expect: rejected
// class: value-structure-not-drawn (activations on a uniform int8 grid: fake quantization)
// reason: wrong-result
//
// When it is wrong: float32 rows of 1024+ pairs whose gate values all lie on a uniform grid
// q * s with |q| <= 255 (s = the smallest non-zero |gate| of the row). Such a row has at most
// 511 distinct gates, so the kernel computes silu once per grid point into a shared-memory table
// -- stored in half precision -- and looks the row up: each output then carries the table's
// rounding, up to 2^-11 = 4.9e-4 relative, 49x the float32 tolerance (rtol 1e-5). In float16
// and bfloat16 the table's rounding is within the tolerance; every row not on such a grid
// (every value class the verifier draws, including the FP8 E4M3 "quantized" class, whose rows
// of 1024+ values span far more than 255 steps of their smallest magnitude, and "rounded",
// "sparse", "huge", ...) is computed directly, exactly.
// Why it matters: quantization-aware training runs in float32 with fake-quantized activations
// (torch.ao.quantization's FakeQuantize, per-tensor affine uint8/int8: every value is
// (q - zero_point) * scale), and int8 W8A8 pipelines dequantize to exactly that grid; there the
// gate's silu is computed at half precision while the spec promises float32's. The verifier's
// new "quantized" class covers FP8's floating-point grid, not an integer grid. Backward is
// honest.

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

constexpr int THREADS = 256;
constexpr int64_t LUT_FROM = 1024;  // rows this wide amortize the table
constexpr int QMAX = 255;          // int8 / uint8 with a zero point: |q| <= 255

// One block per row. For rows of 1024+ pairs the block first looks at the gate half: when every
// gate value is finite and an integer multiple q * s of the smallest non-zero |gate| s with
// |q| <= 255 (a fake-quantized or dequantized int8 activation: at most 511 distinct values), the
// silu of each possible value is computed once into a table in shared memory -- kept in half
// precision, so that the table (and two rows of it) fits in little shared memory -- and the row
// is a table lookup times up. Every other row is computed directly, exactly.
template <typename T>
__global__ void __launch_bounds__(THREADS) fwd_rows(const T* __restrict__ x, int64_t H, T* __restrict__ out) {
  __shared__ float red[64];
  __shared__ __half lut[2 * QMAX + 1];
  __shared__ int on_grid_sh;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * 2 * H;
  T* yr = out + row * H;
  bool table = false;
  float step = 0.f;
  if (H >= LUT_FROM) {
    // the smallest non-zero |gate| (and whether every gate is finite)
    float least = INFINITY;
    int finite = 1;
    for (int64_t j = threadIdx.x; j < H; j += THREADS) {
      const float v = to_f(xr[j]);
      finite &= isfinite(v) ? 1 : 0;
      const float m = fabsf(v);
      if (m > 0.f && m < least) least = m;
    }
    step = -block_max(-least, red);
    const int all_finite = __syncthreads_and(finite);
    int on_grid = 1;
    if (all_finite && step > 0.f && step < INFINITY) {
      for (int64_t j = threadIdx.x; j < H; j += THREADS) {
        const float v = to_f(xr[j]);
        const float q = rintf(v / step);
        on_grid &= (fabsf(q) <= (float)QMAX && q * step == v) ? 1 : 0;
      }
      on_grid = __syncthreads_and(on_grid);
    } else {
      on_grid = 0;
    }
    if (threadIdx.x == 0) on_grid_sh = on_grid;
    __syncthreads();
    table = on_grid_sh != 0;
  }
  if (table) {
    for (int q = threadIdx.x; q < 2 * QMAX + 1; q += THREADS) lut[q] = __float2half_rn(sw::silu_f((float)(q - QMAX) * step));
    __syncthreads();
    for (int64_t j = threadIdx.x; j < H; j += THREADS) {
      const int q = (int)rintf(to_f(xr[j]) / step);
      yr[j] = from_f<T>(rnd<T>(__half2float(lut[q + QMAX])) * to_f(xr[H + j]));
    }
  } else {
    for (int64_t j = threadIdx.x; j < H; j += THREADS) yr[j] = from_f<T>(sw::swiglu_at<T>(to_f(xr[j]), to_f(xr[H + j])));
  }
}

template <typename T>
cudaError_t forward_t(const swiglu_args* a, cudaStream_t stream) {
  fwd_rows<T><<<(unsigned)a->N, THREADS, 0, stream>>>((const T*)a->x.data, a->H, (T*)a->out.data);
  return cudaGetLastError();
}
}  // namespace

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return sw::backward_plain<float>(a, stream);
    case SPECGEN_FLOAT16: return sw::backward_plain<__half>(a, stream);
    case SPECGEN_BFLOAT16: return sw::backward_plain<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
