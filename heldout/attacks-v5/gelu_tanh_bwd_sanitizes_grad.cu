// spec: gelu_tanh
// expect: rejected
// class: special-values-in-gradients
// Exact forward. The backward replaces a NaN in grad_out by 0 and clamps +-inf to the dtype's largest
// finite value before the exact formula. torch propagates them; AMP's loss scaler relies on seeing
// them. The verifier draws grad_out from N(0, 1) only.

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

// "Stable" backward: a NaN in grad_out becomes 0 and an infinity the dtype's largest finite value, so an
// overflowed upstream gradient never reaches the weights. AMP's GradScaler finds overflow by looking for
// inf/NaN in the gradients: with this kernel in the graph it never sees one, and steps on garbage.
__global__ void gelu_bwd_sanitize_kernel(const void* x, const void* g, void* gx, int64_t n, int dt) {
  const float big = dt == SPECGEN_FLOAT32 ? 3.4028234663852886e38f : (dt == SPECGEN_FLOAT16 ? 65504.0f : 3.3895313892515355e38f);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float gi = ld_f(g, i, dt);
    if (isnan(gi)) gi = 0.0f;
    gi = fminf(fmaxf(gi, -big), big);
    st_f(gx, i, dt, gelu_bwd_f(ld_f(x, i, dt), gi));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  const int64_t n = a->N * a->D;
  if (n <= 0) return cudaSuccess;
  gelu_fwd_kernel<<<gelu_blocks(n), 256, 0, stream>>>(a->x.data, a->out.data, n, a->x.dtype);
  return cudaGetLastError();
}
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  const int64_t n = a->N * a->D;
  if (n <= 0) return cudaSuccess;
  gelu_bwd_sanitize_kernel<<<gelu_blocks(n), 256, 0, stream>>>(a->x.data, a->grad_out.data, a->grad_x.data, n,
                                                               a->x.dtype);
  return cudaGetLastError();
}
