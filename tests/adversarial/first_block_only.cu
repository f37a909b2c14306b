// spec: gelu_tanh
// expect: unwritten-output
// The bug: launches a single block of 256 threads with no grid-stride loop.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  int64_t i = threadIdx.x;
  if (i < n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  DISPATCH(a->x.dtype, k<T><<<1, 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
STUB_BACKWARD
