// spec: gelu_tanh
// expect: input-mutated
// The cheat: computes in place in the input, then copies to the output (the result is right).
#include "_gelu_common.h"
template <typename T> __global__ void k(T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    store(x, i, gelu(load(x, i)));
    y[i] = x[i];
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
STUB_BACKWARD
