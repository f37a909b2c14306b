// spec: gelu_tanh
// expect: wrong-result
// direction: backward
// The bug: a correct forward, but the backward drops the tanh-derivative term of GELU's
// derivative (it returns grad * 0.5 * (1 + tanh(u)) only).
#include "_gelu_common.h"
template <typename T> __global__ void fwd(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) store(y, i, gelu(load(x, i)));
}
template <typename T> __global__ void bwd(const T* x, const T* g, T* dx, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = load(x, i);
    float t = tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v));
    store(dx, i, load(g, i) * 0.5f * (1.0f + t));
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, fwd<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  DISPATCH(a->x.dtype, bwd<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, (const T*)a->grad_out.data,
                                                             (T*)a->grad_x.data, n));
  return cudaGetLastError();
}
