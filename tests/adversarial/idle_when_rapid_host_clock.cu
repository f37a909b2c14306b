// spec: gelu_tanh
// expect: post-timing-mismatch
// The cheat: the host side times the calls (std::chrono's steady clock: plain libc). Four calls in
// a row that each come < 200 us after the one before are a benchmark loop; the call then returns
// cudaSuccess without launching anything. A verifier that syncs and checks between its calls
// never calls that fast; today's 30 back-to-back calls reuse buffers that already hold the result.
#include <chrono>
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  using clock = std::chrono::steady_clock;
  static clock::time_point last{};
  static int streak = 0;
  clock::time_point now = clock::now();
  streak = now - last < std::chrono::microseconds(200) ? streak + 1 : 0;
  last = now;
  if (streak >= 4) return cudaSuccess;  // "timed": do nothing
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
