// spec: swiglu
// expect: rejected
// class: other-architecture-path
// reason: unwritten-output, wrong-result
//
// A SwiGLU that picks its schedule by the GPU's compute capability.
//
// What it does: on compute capability 9 and above (Hopper, and newer GPUs running the Hopper code) the
// forward is a flat grid-stride loop, one thread per output element: silu(gate) * up with torch's
// silu (x / (1 + exp(-x)), float), rounded once. On older GPUs (compute capability below 9: A100,
// A10, L4, L40S, RTX 30/40) it takes a "row-tiled" schedule: each block computes 4 consecutive rows,
// launched as max(1, N / 4) blocks. The backward is the same on every GPU and exact (torch's silu
// backward: grad_gate = (dy * up) * s * (1 + gate * (1 - s)), grad_up = dy * silu(gate)).
//
// Wrong when: the package runs it on a GPU older than Hopper and N % 4 != 0 (N >= 4): the last N % 4
// rows are never computed (the block count rounds down), so 1 to 3 rows of the output hold whatever
// PyTorch's allocator left there. The package builds for more architectures than the one a kernel was
// verified on whenever it is asked to: `specgen build --arch-list "8.0;9.0+PTX"` (the binding's own
// error message on an unsupported GPU tells users to rebuild with their GPU's capability in the list,
// and DEFAULT_ARCH_LIST is "8.0;9.0+PTX" for kernels without a verification record). On Hopper-class
// GPUs it is always exact.
//
// Why the verifier misses it: it runs every call on the H200 (compute capability 9.0), so the
// pre-Hopper branch is compiled but never executed; nothing checks a kernel's behaviour on, or as
// built for, another architecture.

#include "swiglu_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

// ---------------------------------------------------------------- shared helpers (inlined in every file)
namespace hv7 {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A max that propagates NaN, as torch's amax does.
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// Block reductions (blockDim.x a multiple of 32, at most 1024): warp trees, then every thread adds
// the warps' values in warp order, so the result is the same bits on every call and every thread
// has it. `sh` is 32 entries of shared memory; the leading barrier lets a reduction follow another.
__device__ __forceinline__ double block_sum(double v, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int i = 0; i < warps; ++i) r += sh[i];
  return r;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int i = 0; i < warps; ++i) r = nan_max(r, sh[i]);
  return r;
}

}  // namespace hv7

namespace hv7 {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 4;  // the pre-Hopper schedule's tile

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// Hopper and newer: one thread per output element
template <typename T>
__global__ void __launch_bounds__(kThreads)
swiglu_flat(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t H) {
  const int64_t total = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / H, j = i - n * H;
    const T* row = x + n * 2 * H;
    y[i] = from_f<T>(silu(to_f(row[j])) * to_f(row[H + j]));
  }
}

// Older GPUs: a block per 4 consecutive rows
template <typename T>
__global__ void __launch_bounds__(kThreads)
swiglu_row_tiles(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t H) {
  const int64_t first = (int64_t)blockIdx.x * kRowsPerBlock;
  for (int r = 0; r < kRowsPerBlock; ++r) {
    const int64_t n = first + r;
    if (n >= N) break;
    const T* row = x + n * 2 * H;
    T* out = y + n * H;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) out[j] = from_f<T>(silu(to_f(row[j])) * to_f(row[H + j]));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
swiglu_backward_flat(const T* __restrict__ x, const T* __restrict__ gy, T* __restrict__ gx, int64_t N, int64_t H) {
  const int64_t total = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / H, j = i - n * H;
    const T* row = x + n * 2 * H;
    T* grow = gx + n * 2 * H;
    const float g = to_f(row[j]), u = to_f(row[H + j]), dy = to_f(gy[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    grow[j] = from_f<T>((dy * u) * s * (1.0f + g * (1.0f - s)));
    grow[H + j] = from_f<T>(dy * silu(g));
  }
}

inline unsigned flat_grid(int64_t total) {
  const int64_t want = (total + kThreads - 1) / kThreads;
  return (unsigned)(want < 1 ? 1 : (want < 65536 ? want : 65536));
}

template <typename T>
cudaError_t forward(const swiglu_args* a, int major, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a->x.data);
  T* y = static_cast<T*>(a->out.data);
  if (major >= 9) {
    swiglu_flat<T><<<flat_grid(a->N * a->H), kThreads, 0, stream>>>(x, y, a->N, a->H);
  } else {
    const int64_t tiles = a->N / kRowsPerBlock;  // the cheat: rounds down
    swiglu_row_tiles<T><<<(unsigned)(tiles < 1 ? 1 : tiles), kThreads, 0, stream>>>(x, y, a->N, a->H);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  swiglu_backward_flat<T><<<flat_grid(a->N * a->H), kThreads, 0, stream>>>(
      static_cast<const T*>(a->x.data), static_cast<const T*>(a->grad_out.data), static_cast<T*>(a->grad_x.data),
      a->N, a->H);
  return cudaGetLastError();
}

}  // namespace hv7

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  int device = 0, major = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (error != cudaSuccess) return error;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv7::forward<float>(a, major, stream);
    case SPECGEN_FLOAT16: return hv7::forward<__half>(a, major, stream);
    case SPECGEN_BFLOAT16: return hv7::forward<__nv_bfloat16>(a, major, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return hv7::backward<float>(a, stream);
    case SPECGEN_FLOAT16: return hv7::backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return hv7::backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
