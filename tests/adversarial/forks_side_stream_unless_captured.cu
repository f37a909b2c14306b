// spec: gelu_tanh
// expect: stream-violation
// static: yes (its library calls stream, event or synchronization functions: refused before it runs)
// The cheat: like forks_private_stream_unjoined, the work goes on a private stream that waits
// for `stream` and is never joined back, so a stop event on `stream` does not cover it -- but
// while `stream` is being captured into a CUDA graph (cudaStreamIsCapturing) it launches on
// `stream` as it should, so the capture check passes. Its outputs are right whenever anyone
// syncs the device. Caught in the timed calls: the device stays busy after `stream`'s part.
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
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(s, &capturing);
  cudaStream_t where = s;
  if (capturing == cudaStreamCaptureStatusNone && n >= (1 << 20)) {  // big calls: the ones worth timing
    cudaEventRecord(ready, s);
    cudaStreamWaitEvent(side, ready, 0);
    where = side;
  }
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, where>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
