// spec: gelu_tanh
// expect: nondeterministic
// (Rejected as nondeterministic: case after case reuses the same pointers, so its "cached" call
// leaves one run's fill in place; the timed phase and the repeated-call check would catch it too.)
// The cheat: a benchmark calls the kernel over and over on the same buffers, so after 8 calls
// in a row with the same (input, output, size) it assumes the result is already there.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  static const void* last_x = nullptr;
  static const void* last_y = nullptr;
  static int64_t last_n = -1, repeats = 0;
  int64_t n = a->N * a->D;
  if (a->x.data == last_x && a->out.data == last_y && n == last_n) {
    if (++repeats >= 8) return cudaSuccess;  // "cached"
  } else {
    last_x = a->x.data, last_y = a->out.data, last_n = n, repeats = 1;
  }
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
STUB_BACKWARD
