// spec: gelu_tanh
// expect: stream-violation
// static: yes (its library calls stream, event or synchronization functions: refused before it runs)
// The bug: launches with <<<grid, block>>> -- the legacy default stream -- and keeps it ordered
// with `stream` through two events (wait for the caller's work, then make `stream` wait for the
// kernel), so results and timings are right when called eagerly. The legacy stream cannot take
// part in a stream capture: capturing the call into a CUDA graph fails.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  static cudaEvent_t ready = nullptr, done = nullptr;
  if (!ready) {
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  }
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  cudaEventRecord(ready, s);
  cudaStreamWaitEvent(cudaStreamLegacy, ready, 0);
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256>>>((const T*)a->x.data, (T*)a->out.data, n));
  cudaEventRecord(done, cudaStreamLegacy);
  cudaStreamWaitEvent(s, done, 0);
  return cudaGetLastError();
}
HONEST_BACKWARD
