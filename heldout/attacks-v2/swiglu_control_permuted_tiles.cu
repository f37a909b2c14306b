// spec: swiglu
// expect: passed
// class: control-unusual-schedule
// reason: passed
//
// control: must pass. A persistent grid (4 blocks per SM) walks tiles of one row x 1024
// columns in a permuted order (tile = k * P mod T with P coprime to T), each block walks its
// tile's columns backwards, and the gate and up halves are read in two separate sweeps
// through shared memory.

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

#define TILE 1024
template <typename T>
__global__ void __launch_bounds__(256) swiglu_fwd_tiles(const T* __restrict__ x, T* __restrict__ y, int64_t N,
                                                        int64_t H, int64_t tiles_per_row, int64_t T_, int64_t P) {
  __shared__ float gate[TILE];
  for (int64_t k = blockIdx.x; k < T_; k += gridDim.x) {
    const int64_t tile = (int64_t)(((unsigned long long)k * (unsigned long long)P) % (unsigned long long)T_);
    const int64_t r = tile / tiles_per_row;
    const int64_t c0 = (tile - r * tiles_per_row) * TILE;
    const int64_t w = H - c0 < TILE ? H - c0 : TILE;
    const T* xr = x + r * 2 * H;
    for (int64_t c = w - 1 - threadIdx.x; c >= 0; c -= blockDim.x) gate[c] = silu_f(to_f(xr[c0 + c]));
    __syncthreads();
    for (int64_t c = w - 1 - threadIdx.x; c >= 0; c -= blockDim.x)
      y[r * H + c0 + c] = from_f<T>(gate[c] * to_f(xr[H + c0 + c]));
    __syncthreads();
  }
}

static long long gcd_ll(long long a, long long b) { while (b) { long long t = a % b; a = b; b = t; } return a; }

template <typename T>
static cudaError_t fwd(const swiglu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
  const int64_t tiles_per_row = (a->H + TILE - 1) / TILE;
  const int64_t T_ = a->N * tiles_per_row;
  long long P = 1000003;  // a prime; fall back to 1 if it shares a factor with T_
  P %= T_;
  if (P == 0 || gcd_ll(P, T_) != 1) P = 1;
  static int sms = 0;  // asked once (the first call is never a capture)
  if (sms <= 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 132;
  }
  const int64_t grid = T_ < (int64_t)sms * 4 ? T_ : (int64_t)sms * 4;
  swiglu_fwd_tiles<T><<<(unsigned)grid, 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, a->N, a->H,
                                                     tiles_per_row, T_, P);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t fwd_unused(const swiglu_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->H;
  if (n == 0) return cudaSuccess;
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
