// spec: gelu_tanh
// expect: not-capturable
// The bug: the kernel is launched with `<<<grid, block>>>`, forgetting the stream argument, so
// it runs on the legacy default stream. Results are right in a plain program that syncs the
// device, and no stream function is called (nothing for the symbol check to see); but the
// caller's `stream` does not order it, and a CUDA graph capture of `stream` fails on it.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  (void)s;
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
