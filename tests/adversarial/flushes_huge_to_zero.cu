// spec: gelu_tanh
// expect: wrong-result
// The shortcut: activations beyond +-1000 "do not happen" (and x^3 overflows float past 4.6e12),
// so they are flushed to 0, where gelu(x) = x for large positive x. Today's largest inputs are
// about +-550 (normal values x100).
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = load(x, i);
    store(y, i, fabsf(v) > 1000.0f ? 0.0f : gelu(v));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
