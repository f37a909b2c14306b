// spec: log_softmax
// expect: reject
// class: per-stream-host-record-assumed-serialized
//
// What it does: log_softmax, forward ((x - max) - log(sum(exp(x - max))), torch's order) and
// backward (grad - exp(out) * sum(grad)), one block per row, float32 math, fixed-order block
// reductions, int64 offsets. The forward's launch (tensor addresses, N, D, dtype and the block size
// chosen from the occupancy calculator) is kept in a record per (device, stream), so that a decode
// loop calling the op on the same buffers step after step launches without asking the occupancy
// calculator again. A mutex guards the table of streams (claiming a slot for a new stream); the
// record itself is read and rewritten without it, on the reasoning that calls on one stream are
// executed in order, so one stream's record is never used by two calls at once.
//
// What is wrong: the stream orders the GPU's work, not the host threads that enqueue it. Two host
// threads that call the op on the same stream run the entry point at the same time and share one
// record: one rewrites the addresses and sizes while the other copies them into its launch. A call
// then launches with the other call's tensors (its own output is never written, the other one's is
// written twice) or with a mix of the two (a wrong N or D for its buffers: rows left out, or reads
// and writes past them).
//
// When a user meets it: a multi-threaded program that never makes a CUDA stream, the common case of
// threaded inference: every thread's current stream is the device's default stream (handle 0, the
// legacy stream), so every call of every thread shares one record. Flask/FastAPI servers that run
// requests on threads, evaluation harnesses that score in a thread pool, nn.DataParallel. The same
// with cudaStreamPerThread from several threads (one handle, a different stream per thread).
//
// Why version 13 does not meet it: its calls from two host threads give each thread a stream of its
// own (its documentation lists "never two legacy-stream calls at once" among its limits); calls on
// the legacy and per-thread default streams are made from the request thread alone, one at a time;
// calls side by side come from one thread. Every record is used by one call at a time, so every
// output is exact.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "log_softmax_abi.h"

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

template <typename T>
__global__ void __launch_bounds__(512) log_softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  const T* xr = x + base;
  T* yr = y + base;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) m = max_nan(m, to_f(xr[i]));
  m = block_max(m, sh);
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += expf(to_f(xr[i]) - m);
  const float ls = logf(block_sum(s, sh));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = from_f<T>((to_f(xr[i]) - m) - ls);
}

template <typename T>
__global__ void __launch_bounds__(512) log_softmax_rows_grad(const T* __restrict__ out, const T* __restrict__ g,
                                                             T* __restrict__ gx, int64_t D) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += to_f(g[base + i]);
  s = block_sum(s, sh);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    gx[base + i] = from_f<T>(to_f(g[base + i]) - expf(to_f(out[base + i])) * s);
  }
}

// ---------------------------------------------------------------- launch records, one per stream (host)
struct Record {
  const void* x;
  void* out;
  int64_t N, D;
  int dtype;
  int threads;
};

struct StreamSlot {
  bool used;
  int device;
  cudaStream_t stream;
  Record rec;
};

constexpr int kSlots = 256;
StreamSlot g_slots[kSlots];
std::mutex g_slots_lock;  // guards the table (a slot claimed for a new stream), not the records

Record* record_of(int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> guard(g_slots_lock);
  for (int k = 0; k < kSlots; ++k) {
    if (g_slots[k].used && g_slots[k].device == device && g_slots[k].stream == stream) return &g_slots[k].rec;
  }
  for (int k = 0; k < kSlots; ++k) {
    if (!g_slots[k].used) {
      g_slots[k].used = true;
      g_slots[k].device = device;
      g_slots[k].stream = stream;
      g_slots[k].rec = Record{};
      return &g_slots[k].rec;
    }
  }
  return nullptr;  // a full table: the call builds its record on its own stack
}

template <typename T>
int threads_for(int64_t D) {
  int per_sm = 0;
  const int threads = D <= 2048 ? 256 : 512;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, log_softmax_rows<T>, threads, 0);
  return per_sm > 0 ? threads : 256;
}

template <typename T>
cudaError_t forward(const log_softmax_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (N <= 0 || D <= 0) return cudaSuccess;
  int device = 0;
  cudaGetDevice(&device);
  Record local{};
  Record* r = record_of(device, stream);
  if (r == nullptr) r = &local;
  // calls on one stream run one after the other: its record needs no lock of its own
  if (r->x != a->x.data || r->out != a->out.data || r->N != N || r->D != D || r->dtype != a->x.dtype) {
    r->x = a->x.data;
    r->out = a->out.data;
    r->N = N;
    r->D = D;
    r->dtype = a->x.dtype;
    r->threads = threads_for<T>(D);
  }
  log_softmax_rows<T><<<(unsigned)r->N, r->threads, 0, stream>>>((const T*)r->x, (T*)r->out, r->D);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  log_softmax_rows_grad<T><<<(unsigned)a->N, 512, 0, stream>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                                              (T*)a->grad_x.data, a->D);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t log_softmax_forward(const log_softmax_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward<float>(a, stream);
    case SPECGEN_FLOAT16: return forward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t log_softmax_backward(const log_softmax_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward<float>(a, stream);
    case SPECGEN_FLOAT16: return backward<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
