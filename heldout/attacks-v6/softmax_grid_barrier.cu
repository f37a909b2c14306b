// spec: softmax
// expect: rejected
// class: concurrency-beyond-two (grid-wide spin barrier without a cooperative launch)
// reason: timeout, crash, wrong-result
//
// When it is wrong: whenever the grid's blocks cannot all be resident at once. The forward is
// one persistent kernel with a grid-wide barrier between its two phases (a counter in the
// workspace, fenced arrival, spin), launched with <<<>>> rather than cudaLaunchCooperativeKernel,
// which is the only launch that guarantees co-residency. The grid is sized to half of the
// device's capacity (SMs x occupancy, asked once), so one call alone, or two calls side by side
// on two streams, always fit; results are exact and deterministic then (fixed merge order).
// (The verifier's calls side by side release both calls together by one event: two grids sized
// to the whole device would both be partly resident and hang, reported as `timeout`. Half each
// is exactly the device.)
// With a third concurrent caller (three server streams; two calls plus a CUDA graph replay),
// the hardware may hand out some blocks of each grid and every grid then spins forever on
// blocks that can never be scheduled: a GPU hang. The same hang needs no concurrency where the
// process gets fewer SMs than the device count the grid was sized by (an MPS client limited by
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, a green context), nor beside a persistent NCCL kernel that
// holds SMs while it waits on another GPU (compute/communication overlap in distributed training).
// Why it matters: a hang of the whole process (and, with NCCL, of the whole job) in
// deployments that share the GPU; the verifier calls at most two at a time on an idle device.
// Backward is honest.

#include "softmax_abi.h"
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

// ---------------------------------------------------------------- softmax: shared pieces
namespace sm {
using namespace hv6;

// 16-byte pieces of a row when every pointer involved and the row length allow it
template <typename T> struct Vec { static constexpr int N = 16 / sizeof(T); };
template <typename T> __device__ __forceinline__ void load16(const T* p, float (&v)[Vec<T>::N]) {
  union { uint4 raw; T e[Vec<T>::N]; } u;
  u.raw = *reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < Vec<T>::N; ++i) v[i] = to_f(u.e[i]);
}
template <typename T> __device__ __forceinline__ void store16(T* p, const float (&v)[Vec<T>::N]) {
  union { uint4 raw; T e[Vec<T>::N]; } u;
#pragma unroll
  for (int i = 0; i < Vec<T>::N; ++i) u.e[i] = from_f<T>(v[i]);
  *reinterpret_cast<uint4*>(p) = u.raw;
}

// backward of one row: grad_x = y * (g - sum(g * y)), one block per row
template <typename T>
__global__ void bwd_rows(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* yr = y + row * D;
  const T* gr = g + row * D;
  T* out = gx + row * D;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += to_f(gr[j]) * to_f(yr[j]);
  const float dot = block_sum(acc, red);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float yv = to_f(yr[j]);
    out[j] = from_f<T>(yv * (to_f(gr[j]) - dot));
  }
}

template <typename T>
cudaError_t backward_plain(const softmax_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  bwd_rows<T><<<(unsigned)N, 256, 0, stream>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                               (T*)a->grad_x.data, D);
  return cudaGetLastError();
}
}  // namespace sm

// ---------------------------------------------------------------- the kernel
namespace {
using namespace hv6;

constexpr int THREADS = 256;
constexpr int64_t CHUNK = 4096;  // elements of a row per work item

struct Plan { int64_t chunks, items; unsigned grid; };

// Blocks that can be resident at once on this device, for this kernel (asked once per device).
int g_capacity[64];

template <typename T> __global__ void persistent(const T*, T*, int64_t, int64_t, int64_t, float2*, unsigned*);

template <typename T>
int capacity() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) { cudaGetLastError(); return 1; }
  if (g_capacity[dev] == 0) {
    int sms = 0, per_sm = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent<T>, THREADS, 0);
    cudaGetLastError();
    g_capacity[dev] = sms * per_sm > 0 ? sms * per_sm : 1;
  }
  return g_capacity[dev];
}

template <typename T>
Plan plan(int64_t N, int64_t D) {
  Plan p;
  p.chunks = (D + CHUNK - 1) / CHUNK;
  p.items = N * p.chunks;
  // half of what fits at once: a second call on another stream still finds room for all of its
  // blocks, so two calls at the same time never wait on each other
  int64_t most = capacity<T>() / 2;
  if (most < 1) most = 1;
  p.grid = (unsigned)(p.items < most ? p.items : most);
  return p;
}

// One kernel, one launch: phase 1 computes a (max, sum of exp) partial per work item (a row's
// CHUNK-element slice) into the workspace; every block then waits at a grid-wide barrier (a
// counter in the workspace: fenced arrival, spin on the count); phase 2 merges each row's
// partials in a fixed order and writes its slice. No second launch, no host round trip. The
// barrier needs every block of the grid resident at once: the grid is sized to half the
// device's capacity, which holds on an otherwise idle GPU and with one other such call.
template <typename T>
__global__ void __launch_bounds__(THREADS) persistent(const T* __restrict__ x, T* __restrict__ y, int64_t D,
                                                      int64_t chunks, int64_t items, float2* part,
                                                      unsigned* arrived) {
  __shared__ float red[64];
  __shared__ float row_m, row_s;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / chunks, c = item % chunks;
    const int64_t lo = c * CHUNK, hi = lo + CHUNK < D ? lo + CHUNK : D;
    const T* xr = x + row * D;
    MS a{-INFINITY, 0.f};
    for (int64_t j = lo + threadIdx.x; j < hi; j += THREADS) ms_add(a, to_f(xr[j]));
    a = block_ms(a, red);
    if (threadIdx.x == 0) part[item] = make_float2(a.m, a.s);
  }
  // grid-wide barrier
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(arrived, 1u);
    while (*(volatile unsigned*)arrived < gridDim.x) __nanosleep(64);
    __threadfence();
  }
  __syncthreads();
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / chunks, c = item % chunks;
    if (threadIdx.x == 0) {
      MS r{-INFINITY, 0.f};
      for (int64_t k = 0; k < chunks; ++k) {
        const float2 q = __ldcg(&part[row * chunks + k]);
        r = ms_merge(r, MS{q.x, q.y});
      }
      row_m = r.m;
      row_s = r.s;
    }
    __syncthreads();
    const float m = row_m, s = row_s;
    const int64_t lo = c * CHUNK, hi = lo + CHUNK < D ? lo + CHUNK : D;
    const T* xr = x + row * D;
    T* yr = y + row * D;
    for (int64_t j = lo + threadIdx.x; j < hi; j += THREADS) yr[j] = from_f<T>(expf(to_f(xr[j]) - m) / s);
    __syncthreads();
  }
}

constexpr size_t COUNTER_BYTES = 256;

size_t workspace_for(int64_t N, int64_t D) {
  const int64_t chunks = (D + CHUNK - 1) / CHUNK;
  return COUNTER_BYTES + (size_t)(N * chunks) * sizeof(float2);
}

template <typename T>
cudaError_t forward_t(const softmax_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < workspace_for(N, D)) return cudaErrorInvalidValue;
  const Plan p = plan<T>(N, D);
  unsigned* arrived = (unsigned*)a->workspace;
  float2* part = (float2*)((char*)a->workspace + COUNTER_BYTES);
  cudaError_t err = cudaMemsetAsync(arrived, 0, sizeof(unsigned), stream);
  if (err != cudaSuccess) return err;
  persistent<T><<<p.grid, THREADS, 0, stream>>>((const T*)a->x.data, (T*)a->out.data, D, p.chunks, p.items, part,
                                                arrived);
  return cudaGetLastError();
}
}  // namespace

extern "C" size_t softmax_forward_workspace(const softmax_args* a) { return workspace_for(a->N, a->D); }

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  switch (a->out.dtype) {
    case SPECGEN_FLOAT32: return sm::backward_plain<float>(a, stream);
    case SPECGEN_FLOAT16: return sm::backward_plain<__half>(a, stream);
    case SPECGEN_BFLOAT16: return sm::backward_plain<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
