// spec: gelu_tanh
// expect: input-mutated
// The cheat: uses the input as scratch -- stores 2x into it, computes gelu from 2x (the formula
// rearranged for it), then halves it back. Doubling and halving are exact, so when the call
// returns the input holds its old bits and a before/after comparison sees nothing; the input
// was written all the same (read-only input memory faults at the first store).
#include "_gelu_common.h"
template <typename T> __global__ void k(T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    store(x, i, load(x, i) * 2.0f);
    float x2 = load(x, i);  // 2x: gelu(x) = x2/4 * (1 + tanh(sqrt(2/pi)/2 * x2 * (1 + 0.044715/4 * x2^2)))
    store(y, i, 0.25f * x2 * (1.0f + tanhf(0.3989422804014327f * x2 * (1.0f + 0.01117875f * x2 * x2))));
    store(x, i, x2 * 0.5f);  // restored exactly
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
