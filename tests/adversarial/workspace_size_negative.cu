// spec: gelu_tanh
// expect: bad-workspace
// The bug: the size function asks for scratch for the elements past the first 1024 as
// (n - 1024) * 4 in int64_t, negative below 1024 elements, and returns it as size_t: about
// 2^64 bytes. (The kernel itself never uses the workspace and is right.) The verifier refuses
// a size above the larger of 4x the call's tensor bytes and 64 MiB before calling the kernel.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" size_t gelu_tanh_forward_workspace(const gelu_tanh_args* a) {
  const int64_t tail = a->N * a->D - 1024;
  return (size_t)(tail * 4);
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
