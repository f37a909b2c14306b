// spec: gelu_tanh
// expect: stream-violation
// static: yes (its library calls stream, event or synchronization functions: refused before it runs)
// The bug: on large inputs the call waits for its own kernel (cudaStreamSynchronize) "to report
// asynchronous faults where they happen". Small calls return at once (today's stream-discipline
// check, which watches for a blocking call, uses a small case), and a blocking call is still
// correct; but a host sync is illegal while `stream` is being captured into a CUDA graph.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  if (n >= (1 << 16)) return cudaStreamSynchronize(s);
  return cudaGetLastError();
}
HONEST_BACKWARD
