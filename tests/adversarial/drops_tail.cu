// spec: gelu_tanh
// expect: unwritten-output
// The bug: works in groups of 4 elements (a "vector width") and forgets the n % 4 tail.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t groups) {
  GRID_STRIDE(g, groups) {
    for (int v = 0; v < 4; ++v) store(y, 4 * g + v, gelu(load(x, 4 * g + v)));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t groups = a->N * a->D / 4;
  if (groups == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(groups), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, groups));
  return cudaGetLastError();
}
STUB_BACKWARD
