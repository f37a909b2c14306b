// spec: gelu_tanh
// expect: stream-violation
// static: yes (cudaMemcpy is synchronous: refused by its symbol before it runs)
// The bug: the first element is computed on the host and copied back with the synchronous
// cudaMemcpy ("a warm-up the compiler cannot remove"). Every value is right; but the copy
// synchronizes the device through the legacy stream, which a CUDA graph capture of `stream`
// does not allow.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  unsigned char probe[4];
  cudaError_t e = cudaMemcpy(probe, a->out.data, 2, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}
HONEST_BACKWARD
