// spec: gelu_tanh
// expect: forbidden-symbol
// static: yes (16 MiB of module memory, ptxas's `bytes gmem`: refused before it runs; the calls side by side
// caught it on the GPU before that rule, as wrong-result)
// The bug: up to 4M elements the forward runs in two launches through a staging buffer that is a
// static __device__ array (16 MB, allocated once with the module) instead of the workspace the
// ABI hands each call: the first launch writes gelu(x) there in float, the second rounds it into
// `out`. One call at a time it is right, every time. Two calls at the same time on two streams
// (two threads of a server, a side stream of a training step) share the array: one call's second
// launch reads the other call's values. Caught by the verifier's calls side by side, and now before
// anything runs by the module-memory rule (more than 16 KiB of `__device__` variables).
#include "_gelu_common.h"
constexpr int64_t kStage = int64_t(1) << 22;
__device__ float g_stage[kStage];
template <typename T> __global__ void to_stage(const T* x, int64_t n) { GRID_STRIDE(i, n) g_stage[i] = gelu(load(x, i)); }
template <typename T> __global__ void from_stage(T* y, int64_t n) { GRID_STRIDE(i, n) store(y, i, g_stage[i]); }
template <typename T> __global__ void direct(const T* x, T* y, int64_t n) { GRID_STRIDE(i, n) store(y, i, gelu(load(x, i))); }
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  const int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  if (n > kStage) {
    DISPATCH(a->x.dtype, direct<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
    return cudaGetLastError();
  }
  DISPATCH(a->x.dtype, to_stage<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, n);
                       from_stage<T><<<blocks_for(n), 256, 0, s>>>((T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
