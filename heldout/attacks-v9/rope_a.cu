// spec: rope
// expect: rejected
// class: plan-cache-published-before-built
// reason: cuda-error, wrong-result, unwritten-output
//
// Rotary embedding (rotate-half), float32 math: out1 = x1*c - x2*s, out2 = x2*c + x1*s per
// (position, head) row; the backward rotates the other way. Each block takes `rows_per_block` rows.
// The launch plan (threads, rows per block, grid) is tuned per shape with the occupancy API and the
// SM count, and cached in a host table keyed by (direction, dtype, S, H, D): open addressing, no
// locks, entries never evicted (a lookup costs a few loads; occupancy queries cost microseconds).
//
// What is wrong: an entry is published before it is built. A new shape's slot gets its key first,
// then the occupancy query runs, then the plan fields are written; a second host thread that meets
// the same new shape in that window finds the key and launches with a plan still zero (grid 0:
// "invalid configuration argument") or half written (rows per block 0: every row left unwritten,
// the output garbage), and two threads that claim one free slot with different shapes leave a key
// torn between them that a later shape can match. A server's worker threads meet new shapes all
// the time (rope runs on the step's token count: every new batch size or prompt length is a new S)
// and meet them together (warm-up, equal-length requests). The verifier's calls from two threads
// use shapes its single-threaded checks already called (the large case, the smoke case, the
// smallest benchmark shape): by then every entry is built and the threads only read.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include "rope_abi.h"

typedef __half f16;
typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const f16* p, int64_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(f16* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// SIGN = -1: forward (x1*c - x2*s, x2*c + x1*s); SIGN = +1: backward (g1*c + g2*s, g2*c - g1*s)
template <typename T, int SIGN>
__global__ void rope_rows(const T* __restrict__ x, const T* __restrict__ cs, const T* __restrict__ sn,
                          T* __restrict__ y, int64_t rows, int64_t H, int64_t half, int rows_per_block) {
  const int64_t r0 = (int64_t)blockIdx.x * rows_per_block;
  const int64_t count = (int64_t)rows_per_block * half;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const int64_t r = r0 + k / half, i = k % half;
    if (r >= rows) break;
    const int64_t xi = r * 2 * half + i, ti = (r / H) * half + i;
    const float a = ld(x, xi), b = ld(x, xi + half), c = ld(cs, ti), s = ld(sn, ti);
    st(y, xi, a * c + SIGN * (b * s));
    st(y, xi + half, b * c - SIGN * (a * s));
  }
}

struct Plan {
  int64_t S, H, D;  // D != 0: the slot is taken
  int dtype, dir;
  int threads, rows_per_block;
  unsigned grid;
};
static Plan g_plans[4096];

template <typename T, int SIGN>
static void build(Plan& p, int64_t rows, int64_t half) {
  int dev = 0, sms = 132, per_sm = 1;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int threads = half >= 128 ? 256 : 128;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rope_rows<T, SIGN>, threads, 0);
  // enough blocks for two waves, one to 64 rows a block
  const int64_t waves = (int64_t)sms * (per_sm > 0 ? per_sm : 1) * 2;
  int64_t rpb = (rows + waves - 1) / waves;
  rpb = rpb < 1 ? 1 : rpb > 64 ? 64 : rpb;
  p.threads = threads;
  p.rows_per_block = (int)rpb;
  p.grid = (unsigned)((rows + rpb - 1) / rpb);
}

template <typename T, int SIGN>
static Plan plan_for(int dtype, int64_t S, int64_t H, int64_t D) {
  const int dir = SIGN < 0 ? 0 : 1;
  uint64_t h = (uint64_t)S * 0x9E3779B97F4A7C15ull ^ (uint64_t)H * 0xC2B2AE3D27D4EB4Full ^
               (uint64_t)D * 0x165667B19E3779F9ull ^ (uint64_t)(dtype * 2 + dir);
  for (int probe = 0; probe < 4096; ++probe) {
    Plan& p = g_plans[(h + probe) & 4095];
    if (p.D == 0) {  // a new shape: take the slot, then tune its plan
      p.S = S; p.H = H; p.dtype = dtype; p.dir = dir; p.D = D;
      build<T, SIGN>(p, S * H, D / 2);
      return p;
    }
    if (p.S == S && p.H == H && p.D == D && p.dtype == dtype && p.dir == dir) return p;
  }
  Plan p = {S, H, D, dtype, dir, 0, 0, 0};  // table full: tune without caching
  build<T, SIGN>(p, S * H, D / 2);
  return p;
}

template <typename T, int SIGN>
static void launch(const specgen_tensor& x, const specgen_tensor& cs, const specgen_tensor& sn,
                   const specgen_tensor& y, int64_t S, int64_t H, int64_t D, cudaStream_t stream) {
  const Plan p = plan_for<T, SIGN>(x.dtype, S, H, D);
  rope_rows<T, SIGN><<<p.grid, p.threads, 0, stream>>>((const T*)x.data, (const T*)cs.data, (const T*)sn.data,
                                                       (T*)y.data, S * H, H, D / 2, p.rows_per_block);
}

#define DISPATCH(dtype, ...)                                                  \
  switch (dtype) {                                                            \
    case SPECGEN_FLOAT32: { typedef float T; __VA_ARGS__; } break;            \
    case SPECGEN_FLOAT16: { typedef f16 T; __VA_ARGS__; } break;              \
    case SPECGEN_BFLOAT16: { typedef bf16 T; __VA_ARGS__; } break;            \
    default: return cudaErrorInvalidValue;                                    \
  }

extern "C" cudaError_t rope_forward(const rope_args* a, cudaStream_t stream) {
  if (a->S <= 0 || a->H <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch<T, -1>(a->x, a->cos, a->sin, a->out, a->S, a->H, a->D, stream));
  return cudaGetLastError();
}

extern "C" cudaError_t rope_backward(const rope_bwd_args* a, cudaStream_t stream) {
  if (a->S <= 0 || a->H <= 0 || a->D <= 0) return cudaSuccess;
  DISPATCH(a->x.dtype, launch<T, 1>(a->grad_out, a->cos, a->sin, a->grad_x, a->S, a->H, a->D, stream));
  return cudaGetLastError();
}
