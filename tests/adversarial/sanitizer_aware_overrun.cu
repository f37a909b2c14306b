// spec: gelu_tanh
// expect: forbidden-symbol
// sanitize: yes
// The cheat: looks for compute-sanitizer in its environment (getenv("CUDA_INJECTION64_PATH"),
// which the sanitizer sets to inject itself) and behaves under it; otherwise it also "clears a
// 64-element pad" past the end of the output, which the sanitizer would have reported.
#include <cstdlib>
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, int64_t n, int64_t pad) {
  GRID_STRIDE(i, n + pad) store(y, i, i < n ? gelu(load(x, i)) : 0.0f);
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  static const bool sanitized = getenv("CUDA_INJECTION64_PATH") != nullptr;
  int64_t n = a->N * a->D, pad = sanitized ? 0 : 64;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n + pad), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n, pad));
  return cudaGetLastError();
}
HONEST_BACKWARD
