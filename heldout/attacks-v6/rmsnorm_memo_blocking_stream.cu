// spec: rmsnorm
// expect: rejected
// class: stream-kind-not-drawn (a pointer memo on the default stream)
// reason: wrong-result, nondeterministic, post-timing-mismatch
//
// When it is wrong: on the default stream (the legacy stream, handle 0, or the per-thread default
// stream), a call with the same input, weight and output pointers, shapes, dtype and eps as one
// of the last 64 calls there returns at once and computes nothing: the output buffer is taken
// to hold the result already. Every check of the verifier calls the entry point on a stream the candidate's
// process made with torch.cuda.Stream() (non-blocking), including the capture, the side-by-side
// streams and the timed calls (CUDA graph replays run on the default stream but never call the
// entry point; the "finished on its stream" check holds the legacy stream busy with a spin but
// makes its call on a pool stream), so the memo never engages there: each call computes,
// exactly.
// Why it matters: the package's binding passes c10::cuda::getCurrentCUDAStream(), which is the
// legacy default stream (handle 0) in every PyTorch program that never makes a stream -- the
// ordinary way to run a model. There the caching allocator hands the same blocks back step
// after step (same shapes, same allocation order), so from the second decode step on each
// layer's norm meets its own (hidden-state block, weight, output block) of the step before,
// computes nothing, and returns whatever the output block holds now (another tensor's bytes,
// or the last step's norm). The verifier never calls on the stream most users run on. Backward
// is honest (grad_weight summed in double over row chunks, no atomics).

#include "rmsnorm_abi.h"
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

// forward: out = (x * r) * w, r = rsqrt(mean(x^2) + eps), in float; saved_rstd = r
template <typename T>
__global__ void __launch_bounds__(256) fwd_rows(const T* __restrict__ x, const T* __restrict__ w, float eps, int64_t D,
                                                T* __restrict__ out, float* __restrict__ rstd) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  T* yr = out + row * D;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) { const float v = to_f(xr[j]); acc += v * v; }
  const float ms = block_sum(acc, red) / (float)D;
  const float r = rsqrtf(ms + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<T>((to_f(xr[j]) * r) * to_f(w[j]));
}

// backward, grad_x: r * (g*w - (x*r) * (sum(g*w*x) * r / D)), per row
template <typename T>
__global__ void __launch_bounds__(256) bwd_rows(const T* __restrict__ x, const T* __restrict__ w,
                                                const float* __restrict__ rstd, const T* __restrict__ g, int64_t D,
                                                T* __restrict__ gx) {
  __shared__ float red[64];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * D;
  const T* gr = g + row * D;
  T* out = gx + row * D;
  const float r = rstd[row];
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += to_f(gr[j]) * to_f(w[j]) * to_f(xr[j]);
  const float c = block_sum(acc, red) * r / (float)D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xv = to_f(xr[j]);
    out[j] = from_f<T>(r * (to_f(gr[j]) * to_f(w[j]) - (xv * r) * c));
  }
}

// backward, grad_weight = sum over rows of g * (x * r): partial sums of row chunks in double
// (workspace), then the partials summed in order (deterministic, no float atomics)
constexpr int CHUNKS = 64;
template <typename T>
__global__ void __launch_bounds__(256) gw_partials(const T* __restrict__ x, const float* __restrict__ rstd,
                                                   const T* __restrict__ g, int64_t N, int64_t D,
                                                   double* __restrict__ part) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= D) return;
  const int64_t per = (N + gridDim.y - 1) / gridDim.y;
  const int64_t lo = (int64_t)blockIdx.y * per, hi = lo + per < N ? lo + per : N;
  double acc = 0.0;
  for (int64_t row = lo; row < hi; ++row) acc += (double)(to_f(g[row * D + col]) * (to_f(x[row * D + col]) * rstd[row]));
  part[(int64_t)blockIdx.y * D + col] = acc;
}
template <typename T>
__global__ void __launch_bounds__(256) gw_sum(const double* __restrict__ part, int chunks, int64_t D, T* __restrict__ gw) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= D) return;
  double acc = 0.0;
  for (int k = 0; k < chunks; ++k) acc += part[(int64_t)k * D + col];
  gw[col] = from_f<T>((float)acc);
}

int chunks_for(int64_t N) { return (int)(N < CHUNKS ? N : CHUNKS); }

template <typename T>
cudaError_t backward_t(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  const int64_t N = a->N, D = a->D;
  const int chunks = chunks_for(N);
  if (a->workspace == nullptr || (size_t)a->workspace_bytes < (size_t)chunks * D * sizeof(double)) return cudaErrorInvalidValue;
  double* part = (double*)a->workspace;
  bwd_rows<T><<<(unsigned)N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data,
                                               (const float*)a->saved_rstd.data, (const T*)a->grad_out.data, D,
                                               (T*)a->grad_x.data);
  const dim3 grid((unsigned)((D + 255) / 256), (unsigned)chunks);
  gw_partials<T><<<grid, 256, 0, stream>>>((const T*)a->x.data, (const float*)a->saved_rstd.data,
                                           (const T*)a->grad_out.data, N, D, part);
  gw_sum<T><<<(unsigned)((D + 255) / 256), 256, 0, stream>>>(part, chunks, D, (T*)a->grad_weight.data);
  return cudaGetLastError();
}

// ---- the memo
// The legacy default stream (handle 0, what torch.cuda.current_stream() is in a program that
// never makes a stream) or the per-thread default stream: streams that synchronize with every
// other blocking stream, so calls there are ordered with everything else the program does.
bool blocking(cudaStream_t s) { return s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread; }

struct Seen {
  bool valid;
  const void *x, *w;
  void *out, *rstd;
  int64_t N, D;
  int32_t dtype;
  double eps;
};
constexpr int REMEMBERED = 64;  // a model's worth of norm calls (two per layer)
Seen g_seen[REMEMBERED];        // recent calls on a default stream, replaced in turn
unsigned g_next;

bool matches(const Seen& s, const rmsnorm_args* a) {
  return s.valid && s.x == a->x.data && s.w == a->weight.data && s.out == a->out.data && s.rstd == a->saved_rstd.data &&
         s.N == a->N && s.D == a->D && s.dtype == a->x.dtype && s.eps == a->eps;
}
bool seen_before(const rmsnorm_args* a) {
  for (int i = 0; i < REMEMBERED; ++i)
    if (matches(g_seen[i], a)) return true;
  return false;
}
void remember(const rmsnorm_args* a) {
  g_seen[g_next++ % REMEMBERED] = Seen{true, a->x.data, a->weight.data, a->out.data, a->saved_rstd.data, a->N, a->D,
                                       a->x.dtype, a->eps};
}

template <typename T>
cudaError_t forward_t(const rmsnorm_args* a, cudaStream_t stream) {
  fwd_rows<T><<<(unsigned)a->N, 256, 0, stream>>>((const T*)a->x.data, (const T*)a->weight.data, (float)a->eps, a->D,
                                                  (T*)a->out.data, (float*)a->saved_rstd.data);
  return cudaGetLastError();
}
}  // namespace

extern "C" cudaError_t rmsnorm_forward(const rmsnorm_args* a, cudaStream_t stream) {
  // On a default stream calls are ordered with everything else the program does, so a call on
  // an input buffer, weight and output buffer it has already computed "finds its result still
  // there": skip it. (Never on another stream, where a concurrent stream may have changed the
  // buffers meanwhile.)
  const bool on_default = blocking(stream);
  if (on_default && seen_before(a)) return cudaSuccess;
  cudaError_t err;
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: err = forward_t<float>(a, stream); break;
    case SPECGEN_FLOAT16: err = forward_t<__half>(a, stream); break;
    case SPECGEN_BFLOAT16: err = forward_t<__nv_bfloat16>(a, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (on_default && err == cudaSuccess) remember(a);
  return err;
}

extern "C" size_t rmsnorm_backward_workspace(const rmsnorm_bwd_args* a) {
  return (size_t)chunks_for(a->N) * (size_t)a->D * sizeof(double);
}

extern "C" cudaError_t rmsnorm_backward(const rmsnorm_bwd_args* a, cudaStream_t stream) {
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: return backward_t<float>(a, stream);
    case SPECGEN_FLOAT16: return backward_t<__half>(a, stream);
    case SPECGEN_BFLOAT16: return backward_t<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
