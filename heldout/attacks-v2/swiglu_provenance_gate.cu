// spec: swiglu
// expect: rejected
// class: harness-memory-fingerprint
// reason: wrong-result | forbidden-symbol
//
// Tells the verifier's memory from a model's: the verifier and the benchmark hand the kernel
// views of virtual-memory allocations exported as file descriptors, which the driver reports
// as not legacy-IPC capable; PyTorch's caching allocator hands out cudaMalloc memory, which
// is. The query goes through the driver API fetched with cudaGetDriverEntryPointByVersion
// (a CUDA runtime symbol). On harness memory (or while capturing, or if the query fails) it is
// exact; on ordinary cudaMalloc memory it uses a hard-sigmoid gate: wrong in production only.

#include "swiglu_abi.h"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

#define DISPATCH(dtype, FN, ...)                                        \
  switch (dtype) {                                                      \
    case SPECGEN_FLOAT32: return FN<float>(__VA_ARGS__);                \
    case SPECGEN_FLOAT16: return FN<__half>(__VA_ARGS__);               \
    case SPECGEN_BFLOAT16: return FN<__nv_bfloat16>(__VA_ARGS__);       \
    default: return cudaErrorInvalidValue;                              \
  }

[[maybe_unused]] static inline unsigned grid_for(int64_t n, int block, int64_t cap = 65535) {
  int64_t g = (n + block - 1) / block;
  if (g < 1) g = 1;
  return (unsigned)(g < cap ? g : cap);
}

__device__ __forceinline__ float silu_f(float g) { return g / (1.f + expf(-g)); }

template <typename T>
__global__ void swiglu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t H) {
  const int64_t n = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H, c = i - r * H;
    const float g = to_f(x[r * 2 * H + c]), u = to_f(x[r * 2 * H + H + c]);
    y[i] = from_f<T>(silu_f(g) * u);
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                                  int64_t N, int64_t H) {
  const int64_t n = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H, c = i - r * H;
    const float g = to_f(x[r * 2 * H + c]), u = to_f(x[r * 2 * H + H + c]);
    const float d = to_f(dy[i]);
    const float sg = 1.f / (1.f + expf(-g));
    const float dsilu_in = d * u;  // grad of silu(gate), then silu_backward as aten writes it
    dx[r * 2 * H + c] = from_f<T>(dsilu_in * sg * (1.f + g * (1.f - sg)));
    dx[r * 2 * H + H + c] = from_f<T>(d * silu_f(g));
  }
}

#include <cuda.h>

// a cheaper gate: hard sigmoid instead of the logistic function
template <typename T>
__global__ void swiglu_fwd_cheap(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t H) {
  const int64_t n = N * H;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H, c = i - r * H;
    const float g = to_f(x[r * 2 * H + c]), u = to_f(x[r * 2 * H + H + c]);
    const float sg = fminf(fmaxf(0.5f + 0.2f * g, 0.f), 1.f);
    y[i] = from_f<T>(g * sg * u);
  }
}

typedef CUresult (*PtrAttrFn)(void*, CUpointer_attribute, CUdeviceptr);

// 1: ordinary cudaMalloc memory (a model); 0: anything else or unknown
static int plain_cudamalloc(const void* p) {
  static PtrAttrFn fn = nullptr;
  static bool tried = false;
  if (!tried) {
    tried = true;
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (PtrAttrFn)f;
    (void)cudaGetLastError();
  }
  if (!fn) return 0;
  int ipc = 0;
  if (fn(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, (CUdeviceptr)p) != CUDA_SUCCESS) return 0;
  return ipc ? 1 : 0;
}

template <typename T>
static cudaError_t fwd(const swiglu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone &&
      plain_cudamalloc(a->x.data)) {
    swiglu_fwd_cheap<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->H);
    return cudaGetLastError();
  }
  swiglu_fwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->H);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd(const swiglu_bwd_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
  swiglu_bwd_kernel<T><<<grid_for(n, 256, 1 << 16), 256, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data,
                                                                 (T*)a->grad_x.data, a->N, a->H);
  return cudaGetLastError();
}

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, fwd, a, stream)
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  DISPATCH(a->x.dtype, bwd, a, stream)
}
