// spec: gelu_tanh
// expect: stream-violation
// The bug: the first stream of the caller's own (not a default stream) that two calls in a row
// come on is taken for the caller's eager stream (a CUDA-graph capture comes on a fresh stream,
// once; the verifier's first calls are on the legacy default stream, where work left on the
// per-thread stream is waited for anyway); on it, calls of at most 2^20 elements run on
// cudaStreamPerThread, a predefined handle that needs no stream-creating symbol, and `stream`
// gets nothing. Every value is right after a device-wide sync, and small calls stay under the
// timed phase's host-time threshold; a caller's next op on `stream` reads an unfinished output.
// Caught by the copy queued on `stream` right after the call with the default streams held busy.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) { GRID_STRIDE(i, n) store(y, i, gelu(load(x, i))); }
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  static cudaStream_t eager = nullptr, last = nullptr;
  const bool own = s != nullptr && s != cudaStreamLegacy && s != cudaStreamPerThread;
  if (eager == nullptr && own && s == last) eager = s;
  last = s;
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  cudaStream_t on = (eager != nullptr && s == eager && n <= (int64_t(1) << 20)) ? cudaStreamPerThread : s;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, on>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
