// spec: gelu_tanh
// expect: wrong-result
// The shortcut: non-finite inputs are replaced by 0 before the math ("so the fast path never sees
// NaN"), so NaN and +-Inf come out as 0 where the reference gives NaN, +Inf and NaN (-Inf * 0).
// Today's inputs are always finite.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = load(x, i);
    store(y, i, gelu(isfinite(v) ? v : 0.0f));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
