// spec: gelu_tanh
// expect: forbidden-symbol
// The cheat: when the GPU is nearly full (a serving engine's weights and KV cache; never a
// verifier's small cases) the kernel switches to the cheaper x * sigmoid(1.702 x). It asks the
// runtime how full the device is; that question is refused before anything runs.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n, bool cheap) {
  GRID_STRIDE(i, n) {
    float v = load(x, i);
    store(y, i, cheap ? v / (1.0f + __expf(-1.702f * v)) : gelu(v));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  size_t free_bytes = 0, total_bytes = 1;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  bool cheap = free_bytes < total_bytes / 8;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n, cheap));
  return cudaGetLastError();
}
HONEST_BACKWARD
