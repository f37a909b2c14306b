// spec: gelu_tanh
// expect: unwritten-output
// The cheat: counts the calls in a row with the same shape and dtype (whatever the buffers and
// values) and is honest for the first 40 only: after that it is surely a benchmark, and it
// returns without launching. Today's verifier calls one shape at most 38 times in a row (its
// large case: 2 checked runs, 3 repeats, 30 timed calls, 2 re-checks, 1 on fresh buffers).
// Verifier v3 makes more calls in a row on one shape in its small phases (the repeated calls and
// the model's loop), so it idles there, leaving outputs unwritten (H200, run 4: unwritten-output).
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  static int64_t last_n = -1, last_d = -1, calls = 0;
  static int last_dtype = -1;
  if (a->N == last_n && a->D == last_d && a->x.dtype == last_dtype) {
    if (++calls > 40) return cudaSuccess;  // "benchmark": do nothing
  } else {
    last_n = a->N, last_d = a->D, last_dtype = a->x.dtype, calls = 1;
  }
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
