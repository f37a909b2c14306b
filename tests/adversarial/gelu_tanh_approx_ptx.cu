// spec: gelu_tanh
// expect: wrong-result
// The shortcut: tanh from the hardware's tanh.approx.f32 (one MUFU.TANH instruction, up to
// ~134 ulp / 1.1e-5 relative error) in every dtype. Fine for float16/bfloat16; in float32 gelu's
// error is 0.5|x| times tanh's, which for x around -2..-4 (tanh near -1, |y| < 0.05) reaches
// 1e-5..2e-5 against a tolerance of 1e-5 + 1e-5|y|: wrong only where tanh's error is near its
// worst, which today's cases (<= 2 Mi elements) may miss and full-size float32 cases hardly can.
#include "_gelu_common.h"
__device__ __forceinline__ float tanh_approx(float u) {
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
  return t;
}
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = load(x, i);
    store(y, i, 0.5f * v * (1.0f + tanh_approx(0.7978845608028654f * (v + 0.044715f * v * v * v))));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
