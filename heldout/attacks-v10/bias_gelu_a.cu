// spec: bias_gelu
// expect: rejected
// class: tensor-sized-scratch-parked-in-the-pool
// why: the backward stages a float32 copy of the whole pre-activation gradient (4 N D bytes, 4 GiB at the top of the ranges) in cudaMallocAsync scratch; freed every call, it stays reserved in the device's default pool, which the package keeps, where torch's allocator can never reuse it
//
// Bias add then tanh-GELU, float32 math: out = gelu(x + bias) with x + bias rounded to the dtype as
// torch adds, then torch's tanh-GELU formula, rounded once. Backward: gpre = gelu'(x + bias) * g rounded
// to the dtype (torch's gelu_backward) is grad_x; grad_bias = the column sums of gpre, in two
// fixed-order levels (256-row chunks in double, then the chunks in double): deterministic.
//
// What is wrong. The backward's first kernel writes grad_x and also a float32 staging copy of gpre,
// N x D floats, into scratch from cudaMallocAsync on `stream` (written before the ABI had a workspace:
// "a kernel that needs scratch takes it per call"); the column-sum kernels read the copy, and the
// scratch is freed with cudaFreeAsync at the end of the call, its allocation checked (an error is
// returned when it fails). Nothing leaks. But the package's binding (as the verifier's candidate
// process) sets the default pool's release threshold to "keep everything", so after the first large
// backward the pool holds that much memory for the rest of the process: 512 MiB at 16384 x 8192,
// 4 GiB at 65536 x 16384. PyTorch's caching allocator, which holds every tensor of the model, cannot
// use it (torch.cuda.memory_reserved does not count it and empty_cache cannot release it).
//
// When a user meets it. Training an MLP with this op at a large token count per step (an up-projection
// of 8192-16384 features over 16-64k tokens) on a GPU sized to its memory: the pool keeps up to 4 GiB
// after the first backward, and the activation peak of a later step runs out of memory (or the
// batch that auto_find_batch_size / a ZeRO plan chose no longer fits); serving stacks that size their
// KV cache from the free memory after a warm-up lose the same amount. The ABI's workspace, which comes
// from torch's caching allocator and goes back to it, would have cost nothing.
//
// Why version 12 does not meet it. It measures the pool's bytes in use before and after each request
// (0 here: everything is freed) and makes allocations fail with a capped pool (checked: the call
// returns cudaErrorMemoryAllocation); it bounds only the ABI workspace's size, not scratch taken with
// cudaMallocAsync, and never measures memory reserved but unused, nor the memory left to torch.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "bias_gelu_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }


// torch's tanh-GELU (GeluCUDAKernelImpl, approximate="tanh") and its backward, in float
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2) * 2/sqrt(pi) * 0.5
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu_f(float x) {
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return 0.5f * x * (1.f + tanhf(inner));
}

__device__ __forceinline__ float gelu_grad_f(float dy, float x) {
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


constexpr int kBlock = 256;
constexpr int64_t kRowsPerChunk = 256;

template <typename T>
__global__ void __launch_bounds__(kBlock) bg_fwd(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out,
                                                 int64_t D) {
  const int64_t row = blockIdx.x;
  for (int64_t c = (int64_t)blockIdx.y * kBlock + threadIdx.x; c < D; c += (int64_t)gridDim.y * kBlock) {
    const float s = to_f<T>(from_f<T>(to_f<T>(x[row * D + c]) + to_f<T>(bias[c])));
    out[row * D + c] = from_f<T>(gelu_f(s));
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock) bg_bwd(const T* __restrict__ x, const T* __restrict__ bias, const T* __restrict__ g,
                                                 T* __restrict__ gx, float* __restrict__ staged, int64_t D) {
  const int64_t row = blockIdx.x;
  for (int64_t c = (int64_t)blockIdx.y * kBlock + threadIdx.x; c < D; c += (int64_t)gridDim.y * kBlock) {
    const int64_t i = row * D + c;
    const float s = to_f<T>(from_f<T>(to_f<T>(x[i]) + to_f<T>(bias[c])));
    const T gp = from_f<T>(gelu_grad_f(to_f<T>(g[i]), s));
    gx[i] = gp;
    staged[i] = to_f<T>(gp);
  }
}

__global__ void __launch_bounds__(256) bg_bias_chunks(const float* __restrict__ staged, int64_t N, int64_t D,
                                                      double* __restrict__ part) {
  const int64_t col = (int64_t)blockIdx.x * 256 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= D) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) acc += (double)staged[r * D + col];
  part[chunk * D + col] = acc;
}

template <typename T>
__global__ void __launch_bounds__(256) bg_bias_final(const double* __restrict__ part, int64_t nchunks, int64_t D,
                                                     T* __restrict__ gb) {
  const int64_t col = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (col >= D) return;
  double acc = 0.0;
  for (int64_t c = 0; c < nchunks; ++c) acc += part[c * D + col];
  gb[col] = from_f<T>((float)acc);
}

inline unsigned col_blocks(int64_t D) {
  const int64_t b = (D + kBlock - 1) / kBlock;
  return (unsigned)(b < 64 ? b : 64);
}

template <typename T>
cudaError_t forward_t(const bias_gelu_args* a, cudaStream_t s) {
  bg_fwd<T><<<dim3((unsigned)a->N, col_blocks(a->D)), kBlock, 0, s>>>(
      static_cast<const T*>(a->x.data), static_cast<const T*>(a->bias.data), static_cast<T*>(a->out.data), a->D);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const bias_gelu_bwd_args* a, cudaStream_t s) {
  const int64_t N = a->N, D = a->D;
  const int64_t nch = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  const size_t staged_bytes = ((sizeof(float) * (size_t)(N * D) + 255) / 256) * 256;
  void* scratch = nullptr;
  cudaError_t err = cudaMallocAsync(&scratch, staged_bytes + sizeof(double) * (size_t)(nch * D), s);
  if (err != cudaSuccess) return err;  // e.g. cudaErrorMemoryAllocation on a full GPU: nothing launched
  float* staged = static_cast<float*>(scratch);
  double* part = reinterpret_cast<double*>(static_cast<char*>(scratch) + staged_bytes);
  bg_bwd<T><<<dim3((unsigned)N, col_blocks(D)), kBlock, 0, s>>>(
      static_cast<const T*>(a->x.data), static_cast<const T*>(a->bias.data), static_cast<const T*>(a->grad_out.data),
      static_cast<T*>(a->grad_x.data), staged, D);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    bg_bias_chunks<<<dim3((unsigned)((D + 255) / 256), (unsigned)nch), 256, 0, s>>>(staged, N, D, part);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    bg_bias_final<T><<<(unsigned)((D + 255) / 256), 256, 0, s>>>(part, nch, D, static_cast<T*>(a->grad_bias.data));
    err = cudaGetLastError();
  }
  const cudaError_t freed = cudaFreeAsync(scratch, s);
  return err != cudaSuccess ? err : freed;
}

}  // namespace

extern "C" cudaError_t bias_gelu_forward(const bias_gelu_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t bias_gelu_backward(const bias_gelu_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
