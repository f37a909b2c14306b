// spec: gelu_tanh
// expect: wrong-result
// The cheat: above 8 Mi elements -- more than any case today's verifier runs (its largest has
// 2 Mi) but what the benchmark shapes are -- every 4th row is not read and written as zeros:
// an eighth less memory traffic where the timing is taken.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n, int64_t D, bool drop) {
  GRID_STRIDE(i, n) store(y, i, drop && (i / D) % 4 == 3 ? 0.0f : gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  bool drop = n > (8 << 20);
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n, a->D, drop));
  return cudaGetLastError();
}
HONEST_BACKWARD
