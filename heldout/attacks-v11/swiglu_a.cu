// spec: swiglu
// expect: reject
// class: launch-cache-keyed-on-every-argument
//
// What it does: silu(gate) * up in float32 (silu(g) = g / (1 + exp(-g)), torch's formula), rounded
// once; the backward is torch's silu backward times up, and silu(gate) for the up half. The forward
// runs a persistent grid: at most 256 blocks, each given a contiguous range of rows, balanced on the
// host from the SM count and the occupancy calculator (the ranges travel as a 2 KiB kernel
// parameter). Computing them costs host time a decode loop pays every step, so the entry point
// keeps what it computed in a process-wide table (std::unordered_map behind a std::mutex) keyed on
// the call's arguments as the struct holds them: the tensors' addresses, N, H, dtype, device. A
// call whose arguments were seen before launches straight from the table.
//
// What is wrong: the key holds the tensors' addresses, and nothing is ever removed. Every call on
// buffers the table has not seen adds an entry of about 2.1 KiB (the key, the ranges, the map's
// node; 2136 bytes a call measured on the compiled library, cpu_checks/host_checks.py) for the life
// of the process. A training or serving process calls the op on addresses the
// caching allocator hands out afresh all the time, so the table, and the host memory, grow without
// bound.
//
// When a user meets it: any long run whose shapes or allocation pattern vary: continuous batching
// (vLLM/SGLang eager steps and prefills: a new token count and new activation addresses most
// steps), variable-length packed training batches, torch.compile with dynamic shapes. At a few
// thousand distinct calls a second (32-80 layers, one call each per step) the process grows by
// several MB a second, GBs an hour, until the host OOM killer ends it; memory profilers of the GPU
// show nothing.
//
// Why version 13 does not meet it: it measures the host heap only around its endurance run, 40,000
// host calls of one case: one set of arguments, one entry, no growth. Its other ~2,000 distinct
// calls leave a few MB in the table, which nothing measures. The outputs are exact, the table is
// locked (calls from two threads are right), and nothing is allocated on the GPU.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "swiglu_abi.h"

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
#include <unordered_map>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 256;

struct Ranges {
  int64_t begin[kMaxBlocks + 1];  // block b takes rows [begin[b], begin[b + 1])
};

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

template <typename T>
__global__ void __launch_bounds__(kThreads) swiglu_fwd(const T* __restrict__ x, int64_t H, T* __restrict__ out,
                                                       const Ranges ranges) {
  const int64_t r0 = ranges.begin[blockIdx.x], r1 = ranges.begin[blockIdx.x + 1];
  const int64_t total = (r1 - r0) * H;
  for (int64_t k = threadIdx.x; k < total; k += kThreads) {
    const int64_t row = r0 + k / H, j = k % H;
    const float g = to_f(x[row * 2 * H + j]), u = to_f(x[row * 2 * H + H + j]);
    out[row * H + j] = from_f<T>(silu(g) * u);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) swiglu_bwd(const T* __restrict__ x, const T* __restrict__ go, int64_t N,
                                                       int64_t H, T* __restrict__ gx) {
  const int64_t total = N * H;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kThreads) {
    const int64_t row = i / H, j = i % H;
    const float g = to_f(x[row * 2 * H + j]), u = to_f(x[row * 2 * H + H + j]), d = to_f(go[i]);
    const float s = 1.f / (1.f + expf(-g));
    gx[row * 2 * H + j] = from_f<T>(d * u * s * (1.f + g * (1.f - s)));
    gx[row * 2 * H + H + j] = from_f<T>(d * (g / (1.f + expf(-g))));
  }
}

// ---------------------------------------------------------------- the launch table (host)
struct Key {
  const void* x;
  const void* out;
  int64_t N, H;
  int dtype, device;
  bool operator==(const Key& o) const {
    return x == o.x && out == o.out && N == o.N && H == o.H && dtype == o.dtype && device == o.device;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = (uint64_t)(uintptr_t)k.x * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uintptr_t)k.out + 0x7F4A7C15ull + (h << 6) + (h >> 2);
    h ^= (uint64_t)k.N * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
    h ^= (uint64_t)k.H * 0x165667B19E3779F9ull + (h << 6) + (h >> 2);
    h ^= (uint64_t)(k.dtype * 131 + k.device) + (h << 6) + (h >> 2);
    return (size_t)h;
  }
};

struct Launch {
  int blocks;
  Ranges ranges;
};

std::mutex& table_lock() {
  static std::mutex m;
  return m;
}

std::unordered_map<Key, Launch, KeyHash>& table() {
  static std::unordered_map<Key, Launch, KeyHash> t;
  return t;
}

template <typename T>
Launch plan(int device, int64_t N, int64_t H) {
  int sms = 0, per_sm = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, swiglu_fwd<T>, kThreads, 0);
  int64_t blocks = (int64_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks > N) blocks = N;
  Launch l{};
  l.blocks = (int)blocks;
  for (int64_t b = 0; b <= blocks; ++b) l.ranges.begin[b] = N * b / blocks;
  return l;
}

template <typename T>
cudaError_t forward(const swiglu_args* a, cudaStream_t stream) {
  const int64_t N = a->N, H = a->H;
  if (N <= 0 || H <= 0) return cudaSuccess;
  int device = 0;
  cudaGetDevice(&device);
  const Key key{a->x.data, a->out.data, N, H, a->x.dtype, device};
  Launch l;
  {
    std::lock_guard<std::mutex> guard(table_lock());
    auto found = table().find(key);
    if (found == table().end()) found = table().emplace(key, plan<T>(device, N, H)).first;
    l = found->second;
  }
  swiglu_fwd<T><<<(unsigned)l.blocks, kThreads, 0, stream>>>((const T*)a->x.data, H, (T*)a->out.data, l.ranges);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  const int64_t total = a->N * a->H;
  if (total <= 0) return cudaSuccess;
  const int64_t want = (total + kThreads - 1) / kThreads;
  const unsigned blocks = (unsigned)(want < 65536 * 8 ? want : 65536 * 8);
  swiglu_bwd<T><<<blocks, kThreads, 0, stream>>>((const T*)a->x.data, (const T*)a->grad_out.data, a->N, a->H,
                                                 (T*)a->grad_x.data);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
