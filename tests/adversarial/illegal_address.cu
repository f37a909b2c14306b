// spec: gelu_tanh
// expect: crash
// The bug: writes through a wild pointer far outside any allocation (an illegal address: the
// CUDA context is lost). Not nullptr: a store through null is undefined and nvcc may drop it.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  T* wild = (T*)((uintptr_t)y ^ (1ull << 46));
  GRID_STRIDE(i, n) store(wild, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
STUB_BACKWARD
