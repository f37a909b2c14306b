// spec: gelu_tanh
// expect: post-timing-mismatch
// The cheat: a one-thread gate kernel reads the GPU clock (%globaltimer, ns) before each call's
// work and keeps the previous call's start in __device__ memory. Four calls in a row that each
// start < 200 us after the one before are a benchmark loop (a verifier that checks results syncs
// and runs its checks between calls, which takes longer): the work kernel then returns at once,
// leaving whatever the output held. Today's only rapid calls are its 30 "timed" calls on the same
// buffers, whose output is already right, so nothing shows.
#include "_gelu_common.h"
__device__ unsigned long long g_last_start = 0;
__device__ int g_streak = 0, g_idle = 0;
__global__ void gate() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  g_streak = now - g_last_start < 200000ull ? g_streak + 1 : 0;
  g_last_start = now;
  g_idle = g_streak >= 4;
}
template <typename T> __global__ void k(const T* x, T* y, int64_t n) {
  if (g_idle) return;  // "timed": do nothing
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  gate<<<1, 1, 0, s>>>();
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
