// spec: gelu_tanh
// expect: rejected
// class: value-structure-not-drawn
// Exact, except in bfloat16: a warp whose 256 consecutive inputs all have the low 4 of bfloat16's 7
// mantissa bits zero (values dequantized from FP8 E4M3, as FP8 serving feeds them) writes
// x * sigmoid(1.702 x) instead (up to ~0.02 off). No value class draws such a tensor.

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "gelu_tanh_abi.h"

__device__ __forceinline__ float ld_f(const void* p, int64_t i, int dt) {
  if (dt == SPECGEN_FLOAT32) return ((const float*)p)[i];
  if (dt == SPECGEN_FLOAT16) return __half2float(((const __half*)p)[i]);
  return __bfloat162float(((const __nv_bfloat16*)p)[i]);
}
__device__ __forceinline__ void st_f(void* p, int64_t i, int dt, float v) {
  if (dt == SPECGEN_FLOAT32) ((float*)p)[i] = v;
  else if (dt == SPECGEN_FLOAT16) ((__half*)p)[i] = __float2half_rn(v);
  else ((__nv_bfloat16*)p)[i] = __float2bfloat16_rn(v);
}

#define GELU_BETA 0.7978845608028654f   // sqrt(2 / pi)
#define GELU_KAPPA 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
  const float inner = GELU_BETA * (x + GELU_KAPPA * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}
// torch's tanh-GELU backward, term by term, in float
__device__ __forceinline__ float gelu_bwd_terms(float x, float* left_d, float* right_rest) {
  const float x_sq = x * x;
  const float inner = GELU_BETA * (x + GELU_KAPPA * x_sq * x);
  const float t = tanhf(inner);
  *left_d = 0.5f * (1.0f + t);
  *right_rest = (1.0f - t * t) * (GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x_sq));  // times 0.5 x
  return t;
}
__device__ __forceinline__ float gelu_bwd_f(float x, float g) {
  float ld, rr;
  gelu_bwd_terms(x, &ld, &rr);
  return g * (ld + 0.5f * x * rr);
}

__global__ void gelu_fwd_kernel(const void* x, void* y, int64_t n, int dt) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    st_f(y, i, dt, gelu_f(ld_f(x, i, dt)));
}
static unsigned gelu_blocks(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (unsigned)(b < 132 * 32 ? (b > 0 ? b : 1) : 132 * 32);
}

__global__ void gelu_bwd_kernel(const void* x, const void* g, void* gx, int64_t n, int dt) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    st_f(gx, i, dt, gelu_bwd_f(ld_f(x, i, dt), ld_f(g, i, dt)));
}

// bfloat16 activations dequantized from FP8 (E4M3: 3 mantissa bits) have the low 4 of bfloat16's 7 mantissa
// bits zero. A warp whose 256 elements all look like that takes a cheap sigmoid approximation
// (x * sigmoid(1.702 x), up to 0.02 off the tanh form).
__global__ void gelu_fwd_bf16_sniff_kernel(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t n) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t base = warp * 256; base < n; base += nwarps * 256) {
    bool fp8 = base + 256 <= n;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t i = base + j * 32 + lane;
      v[j] = 0.0f;
      if (i < n) {
        const __nv_bfloat16 h = x[i];
        const unsigned short bits = *(const unsigned short*)&h;
        fp8 = fp8 && (bits & 0xF) == 0;
        v[j] = __bfloat162float(h);
      }
    }
    fp8 = __all_sync(0xffffffffu, fp8);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t i = base + j * 32 + lane;
      if (i < n) {
        const float r = fp8 ? v[j] / (1.0f + __expf(-1.702f * v[j])) : gelu_f(v[j]);
        y[i] = __float2bfloat16_rn(r);
      }
    }
  }
}

extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  const int64_t n = a->N * a->D;
  if (n <= 0) return cudaSuccess;
  if (a->x.dtype == SPECGEN_BFLOAT16)
    gelu_fwd_bf16_sniff_kernel<<<gelu_blocks(n / 8 + 1), 256, 0, stream>>>((const __nv_bfloat16*)a->x.data,
                                                                            (__nv_bfloat16*)a->out.data, n);
  else
    gelu_fwd_kernel<<<gelu_blocks(n), 256, 0, stream>>>(a->x.data, a->out.data, n, a->x.dtype);
  return cudaGetLastError();
}
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  const int64_t n = a->N * a->D;
  if (n <= 0) return cudaSuccess;
  gelu_bwd_kernel<<<gelu_blocks(n), 256, 0, stream>>>(a->x.data, a->grad_out.data, a->grad_x.data, n, a->x.dtype);
  return cudaGetLastError();
}
