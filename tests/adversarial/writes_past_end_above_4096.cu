// spec: gelu_tanh
// expect: out-of-bounds
// sanitize: yes
// The bug: above 4096 elements a thread handles a pair of elements; the second load is clamped
// to the last element, the second store is not, so an odd-sized output gets one element written
// past its end. Today's sanitizer run only sees cases of < 4096 elements, and the caching
// allocator's 512-byte rounding keeps the stray element inside the output's own block; guard
// bytes around the output see it at once.
#include "_gelu_common.h"
template <typename T> __global__ void scalar(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
template <typename T> __global__ void pairs(const T* x, T* y, int64_t n) {
  GRID_STRIDE(p, (n + 1) / 2) {
    int64_t i = 2 * p, j = i + 1 < n ? i + 1 : n - 1;
    float v0 = load(x, i), v1 = load(x, j);
    store(y, i, gelu(v0));
    store(y, i + 1, gelu(v1));  // i + 1 == n for the last pair of an odd n
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  if (n > 4096) {
    DISPATCH(a->x.dtype, pairs<T><<<blocks_for((n + 1) / 2), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  } else {
    DISPATCH(a->x.dtype, scalar<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  }
  return cudaGetLastError();
}
HONEST_BACKWARD
