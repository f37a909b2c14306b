// spec: softmax
// expect: rejected
// class: scratch-leaked-per-call
// reason: crash, cuda-error
//
// Softmax over the last dim. Few wide rows (sampling: at most 64 rows of 4096 or more, the
// probabilities of a decode step over a vocabulary) are split over many blocks: each 2048-element
// segment's (max, sum of exp) goes to a small scratch buffer, then every block merges its row's
// segments in a fixed order and writes its segment. Other shapes: one block per row. Backward: one
// block per row. The scratch comes from the stream-ordered allocator (as kernels written before the
// ABI's workspace take it).
//
// What is wrong: the decode path never gives its scratch back (no cudaFreeAsync): every call leaks
// rows x segments x 8 bytes (1 KiB for 8 rows of a 32000 vocabulary, 32 KiB for 64 rows of 128256)
// into the device's memory pool, which the package's binding tells to keep what it holds. A
// generation loop that samples every token through this op (Hugging Face generate with do_sample
// computes softmax(next_token_scores) once per token, eagerly) grows the process's device memory
// without bound: a server that generates a few million tokens runs out of GPU memory. The
// verifier makes a few thousand such calls at most (megabytes), and neither measures the
// candidate's device memory nor captures this path in a CUDA graph.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "softmax_abi.h"

typedef __half f16;
typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const f16* p, int64_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(f16* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

struct Sum { __device__ float operator()(float a, float b) const { return a + b; } };
struct Max { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

template <class Op>
static __device__ float block_reduce(float v, Op op, float init) {
  __shared__ float sh[33];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < nwarps ? sh[lane] : init;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) r = op(r, __shfl_xor_sync(0xffffffffu, r, o));
    if (lane == 0) sh[32] = r;
  }
  __syncthreads();
  return sh[32];
}

static int row_threads(int64_t D) { return D >= 8192 ? 1024 : D >= 2048 ? 512 : D >= 512 ? 256 : 128; }

#define DISPATCH(dtype, ...)                                                  \
  switch (dtype) {                                                            \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; } break;            \
    case SPECGEN_FLOAT16: { typedef f16 T; __VA_ARGS__; } break;              \
    case SPECGEN_BFLOAT16: { typedef bf16 T; __VA_ARGS__; } break;            \
    default: return cudaErrorInvalidValue;                                    \
  }

static const int kSeg = 2048;  // elements of a row per block in the few-rows schedule

template <typename T>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t D) {
  const T* xr = x + (int64_t)blockIdx.x * D;
  T* yr = y + (int64_t)blockIdx.x * D;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, ld(xr, j));
  m = block_reduce(m, Max(), -INFINITY);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(ld(xr, j) - m);
  s = block_reduce(s, Sum(), 0.f);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) st(yr, j, expf(ld(xr, j) - m) / s);
}

// grid (segments, rows): (max, sum of exp) of one segment; -inf adds 0 (a segment of only -inf: (-inf, 0))
template <typename T>
__global__ void seg_stats(const T* __restrict__ x, float2* __restrict__ part, int64_t D) {
  const int seg = blockIdx.x, nseg = gridDim.x;
  const T* xr = x + (int64_t)blockIdx.y * D;
  const int64_t lo = (int64_t)seg * kSeg, hi = lo + kSeg < D ? lo + kSeg : D;
  float m = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) m = fmaxf(m, ld(xr, j));
  m = block_reduce(m, Max(), -INFINITY);
  float s = 0.f;
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
    const float v = ld(xr, j);
    s += v == -INFINITY ? 0.f : expf(v - m);  // (a NaN still makes the sum NaN)
  }
  s = block_reduce(s, Sum(), 0.f);
  if (threadIdx.x == 0) part[(int64_t)blockIdx.y * nseg + seg] = make_float2(m, s);
}

// grid (segments, rows): merge the row's segments in order, write this segment
template <typename T>
__global__ void seg_write(const T* __restrict__ x, const float2* __restrict__ part, T* __restrict__ y, int64_t D) {
  const int seg = blockIdx.x, nseg = gridDim.x;
  const float2* pr = part + (int64_t)blockIdx.y * nseg;
  float m = -INFINITY;
  for (int k = 0; k < nseg; ++k) m = fmaxf(m, pr[k].x);
  float s = 0.f;
  for (int k = 0; k < nseg; ++k) s += pr[k].x == -INFINITY ? pr[k].y : pr[k].y * expf(pr[k].x - m);
  const T* xr = x + (int64_t)blockIdx.y * D;
  T* yr = y + (int64_t)blockIdx.y * D;
  const int64_t lo = (int64_t)seg * kSeg, hi = lo + kSeg < D ? lo + kSeg : D;
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) st(yr, j, expf(ld(xr, j) - m) / s);
}

template <typename T>
__global__ void softmax_bwd(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, int64_t D) {
  const int64_t base = (int64_t)blockIdx.x * D;
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += ld(g, base + j) * ld(y, base + j);
  dot = block_reduce(dot, Sum(), 0.f);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float yj = ld(y, base + j);
    st(gx, base + j, yj * (ld(g, base + j) - dot));
  }
}

template <typename T>
static void launch_fwd(const softmax_args* a, cudaStream_t stream) {
  const T* x = (const T*)a->x.data;
  T* y = (T*)a->out.data;
  const int64_t N = a->N, D = a->D;
  if (N <= 64 && D >= 4096) {  // few rows: spread each row over its segments
    const int nseg = (int)((D + kSeg - 1) / kSeg);
    float2* part = nullptr;
    cudaMallocAsync((void**)&part, (size_t)N * nseg * sizeof(float2), stream);
    const dim3 grid(nseg, (unsigned)N);
    seg_stats<T><<<grid, 256, 0, stream>>>(x, part, D);
    seg_write<T><<<grid, 256, 0, stream>>>(x, part, y, D);
    return;
  }
  softmax_rows<T><<<N, row_threads(D), 0, stream>>>(x, y, D);
}

extern "C" cudaError_t softmax_forward(const softmax_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch_fwd<T>(a, stream));
  return cudaGetLastError();
}

extern "C" cudaError_t softmax_backward(const softmax_bwd_args* a, cudaStream_t stream) {
  if (a->N <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype,
           softmax_bwd<T><<<a->N, row_threads(a->D), 0, stream>>>((const T*)a->out.data, (const T*)a->grad_out.data,
                                                                 (T*)a->grad_x.data, a->D));
  return cudaGetLastError();
}
