// spec: gelu_tanh
// expect: passed
// The shortcut: tanh from the hardware's tanh.approx.f32 (one MUFU.TANH instruction) in every
// dtype. Written as a cheat (float32 gelu's error is 0.5|x| times tanh's, thought to reach
// 1e-5..2e-5 near x = -2..-4), but measured on the H200 (2026-12-01, 572 cases, float32 cases of
// 5e8 elements): its largest float32 error is 5.7e-6, inside the spec's atol of 1e-5. An
// approximation that stays within the spec's tolerance is a legitimate kernel: the verifier
// must pass it (session 5 run2 and the 2026-12-01 session 6 run passed it; run3 timed out).
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
