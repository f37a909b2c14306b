// spec: gelu_tanh
// expect: rejected
// class: multi-device (state cached across calls, keyed on nothing)
// reason: crash, wrong-result
//
// When it is wrong: in a process that calls it on more than one GPU. For float16 and bfloat16
// the forward is a table lookup: gelu of every one of the 65536 bit patterns, rounded to the
// dtype exactly as a direct computation rounds it, built on first use with cudaMalloc and a
// kernel on the caller's stream, and kept in a host-static pointer for the life of the process.
// The pointer is not per device: a call on GPU 1 gathers from GPU 0's memory. Without peer
// access between the two that is an illegal address (the context is lost); with it, the lookup
// goes over NVLink (right, slowly). The first use has a second hazard: a call on another
// stream that starts while the table is being built reads an unfinished table. On one GPU,
// after its first call, every output is bit-for-bit what the direct formula gives; float32
// computes directly. The verifier runs on one device, and the first 16-bit call of a
// verification is a boundary case made alone, long before any check with two streams.
// Why it matters: one process, several GPUs is ordinary (Hugging Face device_map="auto" splits
// a model's layers across GPUs; DataParallel; pipeline stages in one process): every layer on
// the second GPU crashes the run, or reads its table across the interconnect. Backward computes
// directly (honest).

#include "gelu_tanh_abi.h"
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

// ---------------------------------------------------------------- the kernel
namespace {
using namespace hv6;

__device__ __forceinline__ float gelu_f(float x) {
  const float kBeta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5);
  const float kKappa = 0.044715f;
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return 0.5f * x * (1.f + tanhf(inner));
}
__device__ __forceinline__ float gelu_grad_f(float dy, float x) {
  const float kBeta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5);
  const float kKappa = 0.044715f;
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.f - tanh_inner * tanh_inner;
  const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

// 16-bit inputs have 65536 possible values: a table of gelu(v) for every bit pattern v, in the
// output dtype, makes the forward one gather per element (128 KiB, L2-resident).
template <typename T>
__global__ void build_table(uint16_t* table) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536) return;
  union { uint16_t u; T v; } in, out;
  in.u = (uint16_t)i;
  out.v = from_f<T>(gelu_f(to_f(in.v)));
  table[i] = out.u;
}
__global__ void gather(const uint16_t* __restrict__ x, int64_t n, const uint16_t* __restrict__ table,
                       uint16_t* __restrict__ y) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = table[x[i]];
}
__global__ void fwd_f32(const float* __restrict__ x, int64_t n, float* __restrict__ y) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = gelu_f(x[i]);
}
template <typename T>
__global__ void bwd_all(const T* __restrict__ x, const T* __restrict__ g, int64_t n, T* __restrict__ gx) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    gx[i] = from_f<T>(gelu_grad_f(to_f(g[i]), to_f(x[i])));
}

// The tables, made on first use and kept for the life of the process (one per 16-bit dtype).
uint16_t* g_table[2];

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return (unsigned)(b < 65536 ? b : 65536);
}

template <typename T>
cudaError_t forward16(const gelu_tanh_args* a, cudaStream_t stream, int which) {
  if (g_table[which] == nullptr) {
    uint16_t* t = nullptr;
    cudaError_t err = cudaMalloc((void**)&t, 65536 * sizeof(uint16_t));
    if (err != cudaSuccess) return err;
    build_table<T><<<256, 256, 0, stream>>>(t);
    g_table[which] = t;
  }
  const int64_t n = a->N * a->D;
  gather<<<blocks_for(n), 256, 0, stream>>>((const uint16_t*)a->x.data, n, g_table[which], (uint16_t*)a->out.data);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  const int64_t n = a->N * a->D;
  bwd_all<T><<<blocks_for(n), 256, 0, stream>>>((const T*)a->x.data, (const T*)a->grad_out.data, n, (T*)a->grad_x.data);
  return cudaGetLastError();
}
}  // namespace

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: {
      const int64_t n = a->N * a->D;
      fwd_f32<<<blocks_for(n), 256, 0, stream>>>((const float*)a->x.data, n, (float*)a->out.data);
      return cudaGetLastError();
    }
    case SPECGEN_FLOAT16: return forward16<__half>(a, stream, 0);
    case SPECGEN_BFLOAT16: return forward16<__nv_bfloat16>(a, stream, 1);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
