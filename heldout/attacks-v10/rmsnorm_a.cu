// spec: rmsnorm
// expect: rejected
// class: shared-memory-threshold-ignores-static-smem
// why: rows of 12257 to 12288 elements are staged in up to 48 KiB of dynamic shared memory without the opt-in, but the kernel's 128 bytes of static shared memory push the block past the default limit: every such launch fails
//
// RMSNorm, float32 math. Forward: one block of 256 threads per row; the row is read once from global
// memory into shared memory as float32 (D x 4 bytes of dynamic shared memory), its sum of squares
// reduced, then normalized from shared memory: rstd = rsqrt(mean(x^2) + eps) as torch computes it,
// out = (x * rstd) * weight rounded once, saved rstd. Rows above 48 KiB opt the kernel in (to the
// widest row of the spec, the same value in every call). Backward: the same code as the control of
// this spec (rmsnorm_b): a block per row for grad_x from the saved rstd, grad_weight in two
// fixed-order levels through the workspace.
//
// What is wrong. The host compares only the dynamic bytes with the default limit, D * 4 <= 48 KiB,
// and launches without opting in. But the dynamic shared memory a launch may take without the opt-in
// is 48 KiB less the kernel's static shared memory (its 32-float reduction buffer: 128 bytes, as
// ptxas reports): for D from 12257 to 12288 the launch asks for more than that and fails with
// cudaErrorInvalidValue ("invalid argument"); D = 12256 still fits (12256 * 4 + 128 = 49152). Every
// forward call with such rows returns that error and writes nothing: the op cannot run a model of
// that hidden size (unless an earlier call of the process, on rows wider than 12288, has already
// opted the kernel in on that device). The same off-by-the-static-memory gate, reported and fixed
// elsewhere: NVIDIA/numba-cuda-mlir issue #143 ("the driver already rejects a 48 KiB request once any
// static shared memory is present").
//
// When a user meets it. Hidden size 12288: Mistral Large 2 (Mistral-Large-Instruct-2407, 123B, RMSNorm,
// hidden_size 12288), and 12288-wide Llama-style configurations (GPT-3-175B-sized Megatron models with
// RMSNorm). Every call of the op on those models fails.
//
// Why version 12 does not meet it. The band is 32 widths. The boundary walk's sizes (powers of two and
// their neighbours, the odd sizes, the model sizes 11008, 13824, 14336, ...), the sweep (... 10668,
// 12588 ...: 18% steps), the full-size shapes and the widths of the threads checks miss it; Hypothesis
// draws a width in it with a probability of about 1 in 4000 per case (log-uniform sizes).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "rmsnorm_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <int BLOCK>
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  v = __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.f;
#pragma unroll
  for (int w = 0; w < BLOCK / 32; ++w) r += red[w];
  return r;
}

template <typename T, int VEC>
__device__ __forceinline__ void load_chunk(const T* p, float* dst) {
  if (VEC == 1) {
    dst[0] = to_f<T>(p[0]);
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) dst[k] = to_f<T>(e[k]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_chunk(T* p, const float* src) {
  if (VEC == 1) {
    p[0] = from_f<T>(src[0]);
  } else {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = from_f<T>(src[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// rstd as torch computes it: rsqrt(mean(x^2) + eps) in float32
__device__ __forceinline__ float rstd_of(float sumsq, int64_t D, float eps) {
  return rsqrtf(sumsq / (float)D + eps);
}

// ---- forward: one block of 256 threads per row; the row is staged in shared memory as float32 (read
// from global memory once, then normalized from shared memory)
constexpr int kFwdBlock = 256;
constexpr size_t kDefaultSmem = 48 * 1024;              // dynamic shared memory a launch gets without opting in
constexpr size_t kWidestRowBytes = 16384 * sizeof(float);  // the spec's widest row, staged

template <typename T>
__global__ void __launch_bounds__(kFwdBlock) rms_fwd_staged(const T* __restrict__ x, const T* __restrict__ w,
                                                            T* __restrict__ out, float* __restrict__ rstd,
                                                            int64_t D, float eps) {
  extern __shared__ float row_f[];
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  float ss = 0.f;
  for (int64_t e = threadIdx.x; e < D; e += kFwdBlock) {
    const float v = to_f<T>(xr[e]);
    row_f[e] = v;
    ss += v * v;
  }
  ss = block_sum<kFwdBlock>(ss, red);  // (its barriers also order the staging stores before the reads below)
  const float r = rstd_of(ss, D, eps);
  if (threadIdx.x == 0) rstd[row] = r;
  T* orow = out + row * D;
  for (int64_t e = threadIdx.x; e < D; e += kFwdBlock) {
    const float y = row_f[e] * r;
    orow[e] = from_f<T>(y * to_f<T>(w[e]));
  }
}

template <typename T>
cudaError_t forward_t(const rmsnorm_args* a, cudaStream_t s) {
  const int64_t N = a->N, D = a->D;
  const size_t smem = (size_t)D * sizeof(float);
  if (smem > kDefaultSmem) {  // past the default: opt in (to the widest row, the same value in every call)
    const cudaError_t err = cudaFuncSetAttribute(rms_fwd_staged<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)kWidestRowBytes);
    if (err != cudaSuccess) return err;
  }
  rms_fwd_staged<T><<<(unsigned)N, kFwdBlock, smem, s>>>(
      static_cast<const T*>(a->x.data), static_cast<const T*>(a->weight.data), static_cast<T*>(a->out.data),
      static_cast<float*>(a->saved_rstd.data), D, (float)a->eps);
  return cudaGetLastError();
}

// ---- backward: grad_x per row (a block per row, two passes), grad_weight per column in two
// fixed-order levels: 64-row chunks summed in double into the workspace, then the chunks in double.
constexpr int kBwdBlock = 256;
constexpr int64_t kRowsPerChunk = 64;

template <typename T>
__global__ void __launch_bounds__(kBwdBlock) rms_bwd_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                          const float* __restrict__ rstd, const T* __restrict__ g,
                                                          T* __restrict__ gx, int64_t D) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  const T* gr = g + row * D;
  const float r = rstd[row];
  float dot = 0.f;
  for (int64_t e = threadIdx.x; e < D; e += kBwdBlock) {
    const float gw = to_f<T>(gr[e]) * to_f<T>(w[e]);
    dot += gw * (to_f<T>(xr[e]) * r);
  }
  dot = block_sum<kBwdBlock>(dot, red);
  const float c = dot / (float)D;
  T* gxr = gx + row * D;
  for (int64_t e = threadIdx.x; e < D; e += kBwdBlock) {
    const float gw = to_f<T>(gr[e]) * to_f<T>(w[e]);
    const float xh = to_f<T>(xr[e]) * r;
    gxr[e] = from_f<T>(r * (gw - xh * c));
  }
}

template <typename T>
__global__ void __launch_bounds__(256) rms_wgrad_chunks(const T* __restrict__ x, const float* __restrict__ rstd,
                                                        const T* __restrict__ g, int64_t N, int64_t D,
                                                        double* __restrict__ part) {
  const int64_t col = (int64_t)blockIdx.x * 256 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= D) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) acc += (double)(to_f<T>(g[r * D + col]) * (to_f<T>(x[r * D + col]) * rstd[r]));
  part[chunk * D + col] = acc;
}

template <typename T>
__global__ void __launch_bounds__(256) rms_wgrad_final(const double* __restrict__ part, int64_t nchunks, int64_t D,
                                                       T* __restrict__ gw) {
  const int64_t col = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (col >= D) return;
  double acc = 0.0;
  for (int64_t c = 0; c < nchunks; ++c) acc += part[c * D + col];
  gw[col] = from_f<T>((float)acc);
}

inline int64_t chunks_of(int64_t N) { return (N + kRowsPerChunk - 1) / kRowsPerChunk; }
inline size_t bwd_workspace(int64_t N, int64_t D) { return sizeof(double) * (size_t)(chunks_of(N) * D); }

template <typename T>
cudaError_t backward_t(const rmsnorm_bwd_args* a, cudaStream_t s) {
  const int64_t N = a->N, D = a->D;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < bwd_workspace(N, D)) return cudaErrorInvalidValue;
  const T* x = static_cast<const T*>(a->x.data);
  const T* w = static_cast<const T*>(a->weight.data);
  const float* r = static_cast<const float*>(a->saved_rstd.data);
  const T* g = static_cast<const T*>(a->grad_out.data);
  rms_bwd_rows<T><<<(unsigned)N, kBwdBlock, 0, s>>>(x, w, r, g, static_cast<T*>(a->grad_x.data), D);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  double* part = static_cast<double*>(a->workspace);
  const int64_t nch = chunks_of(N);
  rms_wgrad_chunks<T><<<dim3((unsigned)((D + 255) / 256), (unsigned)nch), 256, 0, s>>>(x, r, g, N, D, part);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  rms_wgrad_final<T><<<(unsigned)((D + 255) / 256), 256, 0, s>>>(part, nch, D, static_cast<T*>(a->grad_weight.data));
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t rmsnorm_backward_workspace(const rmsnorm_bwd_args* a) { return bwd_workspace(a->N, a->D); }

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
