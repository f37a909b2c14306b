// spec: layernorm_gelu
// expect: rejected
// class: memory-pressure (branches on an allocation's failure)
// reason: wrong-result
//
// When it is wrong: when the GPU is nearly full. The forward stages the layer norm's output in a
// float32 scratch of N x D elements taken with cudaMallocAsync on the stream (the per-call
// allocation the verifier's candidate process keeps cheap, verify/pool.py), then applies the
// GELU at full width. If the allocation fails it does not report the error: it "degrades" to one
// pass whose row mean and variance are estimated from every 8th element of the row, and the
// outputs are off by far more than the tolerance (any row that is not constant every 8 elements).
// The verifier plans every case to the GPU memory free and never fills the GPU (its candidate
// process has tens of GB to spare even at the 10 GB full-size cases), so the allocation always
// succeeds there and every output is exact. The symbol check refuses cudaMemGetInfo and memory
// pool queries so that a kernel cannot compute something else when the GPU is nearly full
// (docs/VERIFIER.md); the allocation's own failure asks the same question with an allowed call.
// Why it matters: serving engines fill the GPU on purpose (vLLM preallocates 90% for its KV
// cache; PyTorch's caching allocator keeps what it freed), and an out-of-memory is exactly when
// this kernel silently returns wrong activations instead of an error. Backward is honest.

#include "layernorm_gelu_abi.h"
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

// gelu (tanh) and its derivative, as torch's CUDA kernels compute them in float
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

// row mean and rstd, two passes over the row in float (every `stride`-th element: 1 = all)
template <typename T>
__device__ __forceinline__ void row_moments(const T* xr, int64_t D, int64_t stride, float eps, float* red,
                                            float& mean, float& rstd) {
  const int64_t count = (D + stride - 1) / stride;
  float acc = 0.f;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) acc += to_f(xr[k * stride]);
  mean = block_sum(acc, red) / (float)count;
  float sq = 0.f;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) { const float d = to_f(xr[k * stride]) - mean; sq += d * d; }
  const float var = block_sum(sq, red) / (float)count;
  rstd = rsqrtf(var + eps);
}

// main path, launch 1: z = (x - mean) * rstd * w + b, staged in float in the scratch
template <typename T>
__global__ void __launch_bounds__(256) ln_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                               float eps, int64_t D, int64_t stride, float* __restrict__ z,
                                               T* __restrict__ direct) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  float mean, rstd;
  row_moments(xr, D, stride, eps, red, mean, rstd);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float zv = (to_f(xr[j]) - mean) * rstd * to_f(w[j]) + to_f(b[j]);
    if (z) z[row * D + j] = zv;
    else direct[row * D + j] = from_f<T>(gelu_f(rnd<T>(zv)));  // the fallback writes the output itself
  }
}
// main path, launch 2: the GELU of the layer norm's output (rounded to T first, as torch's
// layer_norm returns it in T), at full width
template <typename T>
__global__ void gelu_all(const float* __restrict__ z, int64_t n, T* __restrict__ out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = from_f<T>(gelu_f(rnd<T>(z[i])));
}

template <typename T>
cudaError_t forward_t(const layernorm_gelu_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  const T* x = (const T*)a->x.data;
  T* out = (T*)a->out.data;
  float* z = nullptr;
  // Scratch for the staged pass, from the stream's memory pool. When the GPU is too full to give
  // it (serving: the KV cache takes most of it), degrade rather than fail: one pass with the row
  // statistics estimated from every 8th element.
  if (cudaMallocAsync((void**)&z, (size_t)N * (size_t)D * sizeof(float), stream) != cudaSuccess) {
    cudaGetLastError();
    ln_rows<T><<<(unsigned)N, 256, 0, stream>>>(x, (const T*)a->weight.data, (const T*)a->bias.data, (float)a->eps, D,
                                                8, nullptr, out);
    return cudaGetLastError();
  }
  ln_rows<T><<<(unsigned)N, 256, 0, stream>>>(x, (const T*)a->weight.data, (const T*)a->bias.data, (float)a->eps, D, 1,
                                              z, nullptr);
  const int64_t n = N * D;
  const int64_t blocks = (n + 255) / 256 < 65536 ? (n + 255) / 256 : 65536;
  gelu_all<T><<<(unsigned)blocks, 256, 0, stream>>>(z, n, out);
  cudaError_t err = cudaGetLastError();
  cudaFreeAsync(z, stream);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// ---- backward (honest): dz = gelu'(z) * g, then the layer norm's backward
// per row: mean and rstd into the workspace, grad_x
template <typename T>
__global__ void __launch_bounds__(256) bwd_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                                const T* __restrict__ g, float eps, int64_t D, T* __restrict__ gx,
                                                float2* __restrict__ moments) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  const T* gr = g + row * D;
  float mean, rstd;
  row_moments(xr, D, 1, eps, red, mean, rstd);
  if (threadIdx.x == 0) moments[row] = make_float2(mean, rstd);
  float s1 = 0.f, s2 = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xhat = (to_f(xr[j]) - mean) * rstd;
    const float zr = rnd<T>(xhat * to_f(w[j]) + to_f(b[j]));
    const float dz = rnd<T>(gelu_grad_f(to_f(gr[j]), zr));
    const float dy = dz * to_f(w[j]);
    s1 += dy;
    s2 += dy * xhat;
  }
  const float mean_dy = block_sum(s1, red) / (float)D;
  const float mean_dyx = block_sum(s2, red) / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xhat = (to_f(xr[j]) - mean) * rstd;
    const float zr = rnd<T>(xhat * to_f(w[j]) + to_f(b[j]));
    const float dz = rnd<T>(gelu_grad_f(to_f(gr[j]), zr));
    const float dy = dz * to_f(w[j]);
    gx[row * D + j] = from_f<T>(rstd * (dy - mean_dy - xhat * mean_dyx));
  }
}
// grad_weight = sum dz * xhat, grad_bias = sum dz: row-chunk partials in double, then in order
constexpr int CHUNKS = 64;
int chunks_for(int64_t N) { return (int)(N < CHUNKS ? N : CHUNKS); }
template <typename T>
__global__ void __launch_bounds__(256) wb_partials(const T* __restrict__ x, const T* __restrict__ w,
                                                   const T* __restrict__ b, const T* __restrict__ g,
                                                   const float2* __restrict__ moments, int64_t N, int64_t D,
                                                   double* __restrict__ pw, double* __restrict__ pb) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= D) return;
  const int64_t per = (N + gridDim.y - 1) / gridDim.y;
  const int64_t lo = (int64_t)blockIdx.y * per, hi = lo + per < N ? lo + per : N;
  const float wv = to_f(w[col]), bv = to_f(b[col]);
  double aw = 0.0, ab = 0.0;
  for (int64_t row = lo; row < hi; ++row) {
    const float2 mr = moments[row];
    const float xhat = (to_f(x[row * D + col]) - mr.x) * mr.y;
    const float zr = rnd<T>(xhat * wv + bv);
    const float dz = rnd<T>(gelu_grad_f(to_f(g[row * D + col]), zr));
    aw += (double)(dz * xhat);
    ab += (double)dz;
  }
  pw[(int64_t)blockIdx.y * D + col] = aw;
  pb[(int64_t)blockIdx.y * D + col] = ab;
}
template <typename T>
__global__ void __launch_bounds__(256) wb_sum(const double* __restrict__ pw, const double* __restrict__ pb, int chunks,
                                              int64_t D, T* __restrict__ gw, T* __restrict__ gb) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= D) return;
  double aw = 0.0, ab = 0.0;
  for (int k = 0; k < chunks; ++k) { aw += pw[(int64_t)k * D + col]; ab += pb[(int64_t)k * D + col]; }
  gw[col] = from_f<T>((float)aw);
  gb[col] = from_f<T>((float)ab);
}

size_t bwd_workspace(int64_t N, int64_t D) {
  return 256 + (size_t)N * sizeof(float2) + 2 * (size_t)chunks_for(N) * (size_t)D * sizeof(double);
}

template <typename T>
cudaError_t backward_t(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < bwd_workspace(N, D)) return cudaErrorInvalidValue;
  const int chunks = chunks_for(N);
  float2* moments = (float2*)a->workspace;
  char* after = (char*)a->workspace + (((size_t)N * sizeof(float2) + 255) / 256) * 256;
  double* pw = (double*)after;
  double* pb = pw + (size_t)chunks * D;
  const T* x = (const T*)a->x.data;
  const T* w = (const T*)a->weight.data;
  const T* b = (const T*)a->bias.data;
  const T* g = (const T*)a->grad_out.data;
  bwd_rows<T><<<(unsigned)N, 256, 0, stream>>>(x, w, b, g, (float)a->eps, D, (T*)a->grad_x.data, moments);
  const dim3 grid((unsigned)((D + 255) / 256), (unsigned)chunks);
  wb_partials<T><<<grid, 256, 0, stream>>>(x, w, b, g, moments, N, D, pw, pb);
  wb_sum<T><<<(unsigned)((D + 255) / 256), 256, 0, stream>>>(pw, pb, chunks, D, (T*)a->grad_weight.data,
                                                             (T*)a->grad_bias.data);
  return cudaGetLastError();
}
}  // namespace

extern "C" cudaError_t layernorm_gelu_forward(const layernorm_gelu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" size_t layernorm_gelu_backward_workspace(const layernorm_gelu_bwd_args* a) { return bwd_workspace(a->N, a->D); }

extern "C" cudaError_t layernorm_gelu_backward(const layernorm_gelu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
