// spec: gelu_tanh
// expect: stream-violation
// static: yes (its library calls stream, event or synchronization functions: refused before it runs)
// The cheat: the work goes on a private stream that first waits for `stream` (an event), so it
// is ordered after the caller's work and looks right to anyone who syncs the device -- but
// `stream` never waits for it back. An event recorded on `stream` after the call (a benchmark's
// stop event) does not cover the kernel: the call looks free. In a CUDA graph the fork is never
// joined, so capture fails.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  static cudaStream_t side = nullptr;
  static cudaEvent_t ready = nullptr;
  if (!side) {
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  }
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  cudaEventRecord(ready, s);
  cudaStreamWaitEvent(side, ready, 0);  // after the caller's work...
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, side>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();            // ...and never joined back into `stream`
}
HONEST_BACKWARD
