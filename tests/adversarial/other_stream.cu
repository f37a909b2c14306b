// spec: gelu_tanh
// expect: stream-violation
// static: yes (its library calls stream, event or synchronization functions: refused before it runs)
// The cheat: ignores the `stream` argument and launches on a private non-blocking stream,
// so its work is not ordered after the caller's (and escapes the caller's timing).
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t) {
  static cudaStream_t own = nullptr;
  if (!own) cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, own>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
STUB_BACKWARD
