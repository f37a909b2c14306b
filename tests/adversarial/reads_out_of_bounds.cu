// spec: gelu_tanh
// expect: sanitizer
// sanitize: yes
// The bug: "prefetches" the next element without a bounds check: the last thread reads one
// element past the end of the input. The result is right; only compute-sanitizer sees it.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    float next = load(x, i + 1);  // out of bounds for i == n - 1
    float v = load(x, i);
    store(y, i, gelu(v) + (next == 12345.678f ? 1e-30f : 0.0f));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
STUB_BACKWARD
