// spec: softmax
// expect: rejected
// class: capture-unsafe-decode-readback
// why: few-row calls (decode: N <= 16 rows of >= 2048) read a device flag back to the host mid-call; a CUDA graph capture of that call fails
//
// Softmax over the last dim, float32 math; the honest schedule is a block per row, the row in
// registers up to 16384 elements (16-byte vectors when aligned), three passes above (as in the
// control of this spec, softmax_b, whose code it shares line for line). Backward: grad_x =
// out * (g - sum(g * out)).
//
// What is wrong. Calls with at most 16 rows of at least 2048 elements (a sampler's softmax over a
// vocabulary at decode batch sizes) take a split-row schedule: each row is cut into chunks of 2048,
// one block per chunk computes the chunk's (max, sum of exp) into the workspace and raises a flag
// in the workspace when it meets a non-finite element. The host then reads that flag back
// (cudaMemcpyAsync device-to-host into a local int: pageable memory, so the call returns only when
// the copy is done; the host also waits for the value to land, for drivers that may DMA into pageable
// memory directly) and picks the finalize: a fast merge of the chunks' pairs when every element
// was finite, the careful block-per-row kernel otherwise. Eagerly this is exact, only slower: the
// host waits for the stream once per call.
//
// When a user meets it. Every CUDA-graph decode loop at small batch: vLLM and SGLang capture their
// decode step for batch sizes 1, 2, 4, 8, 16, ...; torch.compile(mode="reduce-overhead") and
// Hugging Face's static-cache generate capture it too. Nothing runs while a stream is captured, so the
// flag cannot be read during a capture: a device-to-host copy into pageable memory is refused there
// (cudaErrorStreamCaptureUnsupported, and the capture is invalidated), and were it recorded as a graph
// node instead, the flag would never land and the call would give up with an error after its bounded
// wait. Either way the engine's graph capture fails at start-up. Eagerly, every decode step
// loses its CPU/GPU overlap (the host waits for the stream).
//
// Why version 12 does not meet it. The capture check captures the smoke case (37 x 37: 37 rows)
// and the first full-size case (16384 x 8192); the endurance run captures the smoke case. Every
// few-row call (the boundary and Hypothesis cases with N <= 16, the benchmark shapes 8 x 4096 in the
// timed phase, the model's loop, the calls side by side and from two threads at 8 x 4096) is an
// eager call, where the readback is correct. The static rules refuse synchronous copies
// (cudaMemcpy) but not cudaMemcpyAsync, whose host blocking depends on its destination.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "softmax_abi.h"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// torch's max: NaN wins
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

// Deterministic block reductions: a butterfly in each warp, then every thread adds the warps'
// values in warp order (the same bits in every thread). `red` holds 32 floats.
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

template <int BLOCK>
__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  v = __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < BLOCK / 32; ++w) r = nan_max(r, red[w]);
  return r;
}

template <typename T, int VEC>
struct Chunk { T v[VEC]; };

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

// One row per block held in registers: thread t owns chunks c = t + j * BLOCK (VEC elements each).
template <typename T, int BLOCK, int ITEMS, int VEC>
__global__ void __launch_bounds__(BLOCK) softmax_fwd_reg(const T* __restrict__ x, T* __restrict__ out, int64_t D) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  T* orow = out + row * D;
  constexpr int CH = ITEMS / VEC;
  float v[ITEMS];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int64_t e = ((int64_t)j * BLOCK + threadIdx.x) * VEC;
    if (e < D) {
      load_chunk<T, VEC>(xr + e, &v[j * VEC]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) m = nan_max(m, v[j * VEC + k]);
    }
  }
  m = block_max<BLOCK>(m, red);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int64_t e = ((int64_t)j * BLOCK + threadIdx.x) * VEC;
    if (e < D) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += expf(v[j * VEC + k] - m);
    }
  }
  s = block_sum<BLOCK>(s, red);
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int64_t e = ((int64_t)j * BLOCK + threadIdx.x) * VEC;
    if (e < D) {
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = expf(v[j * VEC + k] - m) / s;
      store_chunk<T, VEC>(orow + e, o);
    }
  }
}

template <typename T, int BLOCK, int ITEMS, int VEC>
__global__ void __launch_bounds__(BLOCK) softmax_bwd_reg(const T* __restrict__ y, const T* __restrict__ g,
                                                          T* __restrict__ gx, int64_t D) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  constexpr int CH = ITEMS / VEC;
  float yv[ITEMS], gv[ITEMS];
  float dot = 0.f;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int64_t e = ((int64_t)j * BLOCK + threadIdx.x) * VEC;
    if (e < D) {
      load_chunk<T, VEC>(y + row * D + e, &yv[j * VEC]);
      load_chunk<T, VEC>(g + row * D + e, &gv[j * VEC]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) dot += gv[j * VEC + k] * yv[j * VEC + k];
    }
  }
  dot = block_sum<BLOCK>(dot, red);
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int64_t e = ((int64_t)j * BLOCK + threadIdx.x) * VEC;
    if (e < D) {
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = yv[j * VEC + k] * (gv[j * VEC + k] - dot);
      store_chunk<T, VEC>(gx + row * D + e, o);
    }
  }
}

// Rows wider than the register schedule: three passes (two for the backward) over global memory.
template <typename T>
__global__ void __launch_bounds__(1024) softmax_fwd_loop(const T* __restrict__ x, T* __restrict__ out, int64_t D) {
  __shared__ float red[32];
  const T* xr = x + (int64_t)blockIdx.x * D;
  T* orow = out + (int64_t)blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t e = threadIdx.x; e < D; e += 1024) m = nan_max(m, to_f<T>(xr[e]));
  m = block_max<1024>(m, red);
  float s = 0.f;
  for (int64_t e = threadIdx.x; e < D; e += 1024) s += expf(to_f<T>(xr[e]) - m);
  s = block_sum<1024>(s, red);
  for (int64_t e = threadIdx.x; e < D; e += 1024) orow[e] = from_f<T>(expf(to_f<T>(xr[e]) - m) / s);
}

template <typename T>
__global__ void __launch_bounds__(1024) softmax_bwd_loop(const T* __restrict__ y, const T* __restrict__ g,
                                                         T* __restrict__ gx, int64_t D) {
  __shared__ float red[32];
  const int64_t base = (int64_t)blockIdx.x * D;
  float dot = 0.f;
  for (int64_t e = threadIdx.x; e < D; e += 1024) dot += to_f<T>(g[base + e]) * to_f<T>(y[base + e]);
  dot = block_sum<1024>(dot, red);
  for (int64_t e = threadIdx.x; e < D; e += 1024)
    gx[base + e] = from_f<T>(to_f<T>(y[base + e]) * (to_f<T>(g[base + e]) - dot));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T, int BLOCK, int ITEMS>
void launch_fwd_reg(const T* x, T* out, int64_t N, int64_t D, bool vec, cudaStream_t s) {
  constexpr int V = 16 / (int)sizeof(T);
  if (vec) softmax_fwd_reg<T, BLOCK, ITEMS, V><<<(unsigned)N, BLOCK, 0, s>>>(x, out, D);
  else softmax_fwd_reg<T, BLOCK, ITEMS, 1><<<(unsigned)N, BLOCK, 0, s>>>(x, out, D);
}

template <typename T, int BLOCK, int ITEMS>
void launch_bwd_reg(const T* y, const T* g, T* gx, int64_t N, int64_t D, bool vec, cudaStream_t s) {
  constexpr int V = 16 / (int)sizeof(T);
  if (vec) softmax_bwd_reg<T, BLOCK, ITEMS, V><<<(unsigned)N, BLOCK, 0, s>>>(y, g, gx, D);
  else softmax_bwd_reg<T, BLOCK, ITEMS, 1><<<(unsigned)N, BLOCK, 0, s>>>(y, g, gx, D);
}

// ---- few rows (decode): a row split over blocks of 2048-element chunks
constexpr int64_t kFewRows = 16;         // at most this many rows
constexpr int64_t kFewMinWidth = 2048;   // of at least this width
constexpr int kChunk = 2048;             // elements per block
constexpr size_t kFlagBytes = 256;       // the flag word, padded to the workspace's alignment

inline bool few_rows(int64_t N, int64_t D) { return N <= kFewRows && D >= kFewMinWidth; }
inline int64_t chunks_of(int64_t D) { return (D + kChunk - 1) / kChunk; }
inline size_t few_workspace(int64_t N, int64_t D) { return kFlagBytes + sizeof(float2) * (size_t)(N * chunks_of(D)); }

// chunk c of row r: its (max, sum of exp(x - max)); any non-finite element raises the flag
template <typename T>
__global__ void __launch_bounds__(256) few_partials(const T* __restrict__ x, int64_t D, int64_t nch,
                                                    float2* __restrict__ part, int* __restrict__ flag) {
  __shared__ float red[32];
  const int64_t row = blockIdx.y, c = blockIdx.x;
  const T* xr = x + row * D;
  const int64_t lo = c * kChunk, hi = lo + kChunk < D ? lo + kChunk : D;
  float m = -INFINITY;
  int bad = 0;
  for (int64_t e = lo + threadIdx.x; e < hi; e += 256) {
    const float v = to_f<T>(xr[e]);
    bad |= !isfinite(v);
    m = nan_max(m, v);
  }
  m = block_max<256>(m, red);
  float sum = 0.f;
  for (int64_t e = lo + threadIdx.x; e < hi; e += 256) sum += expf(to_f<T>(xr[e]) - m);
  sum = block_sum<256>(sum, red);
  if (bad) atomicOr(flag, 1);
  if (threadIdx.x == 0) part[row * nch + c] = make_float2(m, sum);
}

// the fast merge: the row's chunks' pairs in chunk order (finite rows only: a chunk whose every
// element is -inf has max -inf and a NaN sum, which this merge does not guard)
template <typename T>
__global__ void __launch_bounds__(256) few_finalize(const T* __restrict__ x, T* __restrict__ out, int64_t D,
                                                    int64_t nch, const float2* __restrict__ part) {
  const int64_t row = blockIdx.y, c = blockIdx.x;
  const float2* pr = part + row * nch;
  float M = -INFINITY;
  for (int64_t k = 0; k < nch; ++k) M = fmaxf(M, pr[k].x);
  float S = 0.f;
  for (int64_t k = 0; k < nch; ++k) S += pr[k].y * expf(pr[k].x - M);
  const int64_t lo = c * kChunk, hi = lo + kChunk < D ? lo + kChunk : D;
  for (int64_t e = lo + threadIdx.x; e < hi; e += 256)
    out[row * D + e] = from_f<T>(expf(to_f<T>(x[row * D + e]) - M) / S);
}

template <typename T>
cudaError_t forward_rows(const T* x, T* out, int64_t N, int64_t D, cudaStream_t s) {
  constexpr int V = 16 / (int)sizeof(T);
  const bool vec = aligned16(x) && aligned16(out) && D % V == 0;
  if (D <= 1024) launch_fwd_reg<T, 128, 8>(x, out, N, D, vec, s);
  else if (D <= 4096) launch_fwd_reg<T, 256, 16>(x, out, N, D, vec, s);
  else if (D <= 16384) launch_fwd_reg<T, 512, 32>(x, out, N, D, vec, s);
  else softmax_fwd_loop<T><<<(unsigned)N, 1024, 0, s>>>(x, out, D);
  return cudaGetLastError();
}

template <typename T>
cudaError_t forward_t(const softmax_args* a, cudaStream_t s) {
  const int64_t N = a->N, D = a->D;
  const T* x = static_cast<const T*>(a->x.data);
  T* out = static_cast<T*>(a->out.data);
  if (!few_rows(N, D)) return forward_rows<T>(x, out, N, D, s);
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < few_workspace(N, D)) return cudaErrorInvalidValue;
  int* flag = static_cast<int*>(a->workspace);
  float2* part = reinterpret_cast<float2*>(static_cast<char*>(a->workspace) + kFlagBytes);
  const int64_t nch = chunks_of(D);
  cudaError_t err = cudaMemsetAsync(flag, 0, sizeof(int), s);
  if (err != cudaSuccess) return err;
  few_partials<T><<<dim3((unsigned)nch, (unsigned)N), 256, 0, s>>>(x, D, nch, part, flag);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  // which finalize: read the flag back (a few bytes). A copy into pageable memory returns once it is
  // done; where the driver may write pageable memory directly (HMM) it can return earlier, so wait for
  // the value to land (bounded: a copy that never lands is an error, not a hang).
  volatile int any_nonfinite = -1;
  err = cudaMemcpyAsync(const_cast<int*>(&any_nonfinite), flag, sizeof(int), cudaMemcpyDeviceToHost, s);
  if (err != cudaSuccess) return err;
  for (long spins = 0; any_nonfinite == -1; ++spins)
    if (spins > (1L << 32)) return cudaErrorLaunchTimeout;
  if (any_nonfinite) return forward_rows<T>(x, out, N, D, s);  // NaN, infinities, masked chunks: the careful kernel
  few_finalize<T><<<dim3((unsigned)nch, (unsigned)N), 256, 0, s>>>(x, out, D, nch, part);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_t(const softmax_bwd_args* a, cudaStream_t s) {
  const int64_t N = a->N, D = a->D;
  const T* y = static_cast<const T*>(a->out.data);
  const T* g = static_cast<const T*>(a->grad_out.data);
  T* gx = static_cast<T*>(a->grad_x.data);
  constexpr int V = 16 / (int)sizeof(T);
  const bool vec = aligned16(y) && aligned16(g) && aligned16(gx) && D % V == 0;
  if (D <= 1024) launch_bwd_reg<T, 128, 8>(y, g, gx, N, D, vec, s);
  else if (D <= 4096) launch_bwd_reg<T, 256, 16>(y, g, gx, N, D, vec, s);
  else if (D <= 16384) launch_bwd_reg<T, 512, 32>(y, g, gx, N, D, vec, s);
  else softmax_bwd_loop<T><<<(unsigned)N, 1024, 0, s>>>(y, g, gx, D);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t softmax_forward_workspace(const softmax_args* a) {
  return few_rows(a->N, a->D) ? few_workspace(a->N, a->D) : 0;
}

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return forward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return forward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return forward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
