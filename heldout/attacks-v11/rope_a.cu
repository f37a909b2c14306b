// spec: rope
// expect: reject
// class: optional-setup-error-left-pending
//
// What it does: rotate-half rotary embedding, forward (x1*c - x2*s, x2*c + x1*s) and backward
// (g1*c + g2*s, g2*c - g1*s), one thread per rotated pair, float32 math rounded once, int64
// offsets. The cos/sin tables are shared by every layer's q and k (64 calls a step for a 32-layer
// model), so on its first call on each device the entry point sets aside a quarter of the L2 that
// the device allows for persisting accesses (cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize)),
// and when that works it launches with an access-policy window over the cos table (hit property
// persisting), through cudaLaunchKernelEx; when the set-aside is refused it just launches without
// the window. The entry point returns the launch's own status, as cudaLaunchKernelEx gives it.
//
// What is wrong: a runtime call that fails also records its error as the calling thread's last
// error, and nothing here reads it back (cudaGetLastError) after the refused set-aside. The call
// returns cudaSuccess; the error stays pending and is raised by whatever checks next: the next
// PyTorch kernel launch in that thread (C10_CUDA_KERNEL_LAUNCH_CHECK calls cudaGetLastError) throws
// "CUDA error: ..." from an unrelated op, typically the attention right after rope.
//
// When a user meets it: where the set-aside cannot be changed by the process. Under MPS (the CUDA
// Programming Guide: "When using MPS, the L2 cache set-aside size cannot be changed by
// cudaDeviceSetLimit", only by the MPS daemon's environment) -- Triton Inference Server and
// Kubernetes GPU sharing with MPS, many small models per GPU -- and wherever the driver refuses the
// limit (vGPU profiles). The first forward of the process raises an error from another op, every
// time; the model cannot run there at all. (On a GPU it owns, the process keeps a quarter of the
// persisting L2 limit set aside for the rest of its life, and the cos table's lines pinned there;
// that only slows other kernels a little.)
//
// Why version 13 does not meet it: it runs on a whole H100/H200 without MPS, where the set-aside
// succeeds and no error is recorded; the outputs are exact either way (the window is a cache hint),
// and the entry point returns cudaSuccess. It reads the context's stack-size limit after every
// request, never the persisting-L2 limit; a pending error would show in its candidate process only
// if one were recorded there.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "rope_abi.h"

namespace {

// ---------------------------------------------------------------- element access
// 16-bit values are widened to float32, computed in float32 and rounded to nearest once.
[[maybe_unused]] __device__ __forceinline__ float to_f(float v) { return v; }
[[maybe_unused]] __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
[[maybe_unused]] __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// max that propagates NaN, as torch's amax/max do
[[maybe_unused]] __device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

// ---------------------------------------------------------------- deterministic reductions
template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

[[maybe_unused]] __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order; every thread gets the result. `sh` holds 32 values.
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V r = lane < warps ? sh[lane] : V(0);
    r = warp_sum(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

[[maybe_unused]] __device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? sh[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

}  // namespace
#include <mutex>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDevices = 64;

template <typename T>
__global__ void __launch_bounds__(kThreads) rope_fwd(const T* __restrict__ x, const T* __restrict__ cosv,
                                                     const T* __restrict__ sinv, int64_t rows, int64_t H, int64_t half,
                                                     T* __restrict__ out) {
  const int64_t total = rows * half;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kThreads) {
    const int64_t j = i % half, row = i / half;  // row = s * H + h
    const int64_t s = row / H;
    const float c = to_f(cosv[s * half + j]), sn = to_f(sinv[s * half + j]);
    const int64_t b = row * 2 * half;
    const float x1 = to_f(x[b + j]), x2 = to_f(x[b + half + j]);
    out[b + j] = from_f<T>(x1 * c - x2 * sn);
    out[b + half + j] = from_f<T>(x2 * c + x1 * sn);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) rope_bwd(const T* __restrict__ g, const T* __restrict__ cosv,
                                                     const T* __restrict__ sinv, int64_t rows, int64_t H, int64_t half,
                                                     T* __restrict__ gx) {
  const int64_t total = rows * half;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kThreads) {
    const int64_t j = i % half, row = i / half;
    const int64_t s = row / H;
    const float c = to_f(cosv[s * half + j]), sn = to_f(sinv[s * half + j]);
    const int64_t b = row * 2 * half;
    const float g1 = to_f(g[b + j]), g2 = to_f(g[b + half + j]);
    gx[b + j] = from_f<T>(g1 * c + g2 * sn);
    gx[b + half + j] = from_f<T>(g2 * c - g1 * sn);
  }
}

// ---------------------------------------------------------------- persisting L2 for the tables (host)
struct L2Setup {
  std::once_flag once;
  bool window = false;  // the set-aside was granted: launch with the access-policy window
  size_t max_window = 0;  // cudaDevAttrMaxAccessPolicyWindowSize
};
L2Setup g_l2[kMaxDevices];

void set_aside(int device) {
  L2Setup& st = g_l2[device];
  int persisting = 0, max_window = 0;
  cudaDeviceGetAttribute(&persisting, cudaDevAttrMaxPersistingL2CacheSize, device);
  cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device);
  st.max_window = max_window > 0 ? (size_t)max_window : 0;
  if (persisting > 0 && st.max_window > 0) {
    // a quarter of what the device allows: the tables of a long context fit, the rest of the L2 stays normal
    if (cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, (size_t)persisting / 4) == cudaSuccess) st.window = true;
  }
}

template <typename Kernel, typename... Args>
cudaError_t launch(Kernel kernel, int64_t work, const void* table, size_t table_bytes, cudaStream_t stream,
                   Args... args) {
  int device = 0;
  cudaGetDevice(&device);
  const bool known = device >= 0 && device < kMaxDevices;
  if (known) std::call_once(g_l2[device].once, set_aside, device);
  const int64_t want = (work + kThreads - 1) / kThreads;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(want < 65536 * 8 ? want : 65536 * 8));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  cfg.attrs = attr;
  cfg.numAttrs = 0;
  if (known && g_l2[device].window) {
    attr[0].id = cudaLaunchAttributeAccessPolicyWindow;
    attr[0].val.accessPolicyWindow.base_ptr = const_cast<void*>(table);
    attr[0].val.accessPolicyWindow.num_bytes =
        table_bytes < g_l2[device].max_window ? table_bytes : g_l2[device].max_window;
    attr[0].val.accessPolicyWindow.hitRatio = 1.0f;
    attr[0].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr[0].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename T>
cudaError_t forward(const rope_args* a, cudaStream_t stream) {
  const int64_t half = a->D / 2, rows = a->S * a->H;
  if (rows <= 0 || half <= 0) return cudaSuccess;
  return launch(rope_fwd<T>, rows * half, a->cos.data, (size_t)(a->S * half) * sizeof(T), stream,
                (const T*)a->x.data, (const T*)a->cos.data, (const T*)a->sin.data, rows, a->H, half, (T*)a->out.data);
}

template <typename T>
cudaError_t backward(const rope_bwd_args* a, cudaStream_t stream) {
  const int64_t half = a->D / 2, rows = a->S * a->H;
  if (rows <= 0 || half <= 0) return cudaSuccess;
  return launch(rope_bwd<T>, rows * half, a->cos.data, (size_t)(a->S * half) * sizeof(T), stream,
                (const T*)a->grad_out.data, (const T*)a->cos.data, (const T*)a->sin.data, rows, a->H, half,
                (T*)a->grad_x.data);
}

}  // namespace

extern "C" cudaError_t rope_forward(const rope_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t rope_backward(const rope_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
