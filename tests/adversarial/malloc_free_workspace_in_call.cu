// spec: gelu_tanh
// expect: forbidden-symbol
// static: yes (cudaMalloc/cudaFree are refused by their symbols; the CUDA graph capture failed on the GPU
// before that rule, as not-capturable)
// The bug: a scratch buffer is taken with cudaMalloc and given back with cudaFree in every
// call, the usual first draft of a workspace. The result is right, but cudaFree synchronizes
// the device and neither call is allowed while `stream` is being captured into a CUDA graph
// (cudaMallocAsync/cudaFreeAsync on `stream` are, and keep the allocation in stream order).
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, float* tmp, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    tmp[i] = gelu(load(x, i));
    store(y, i, tmp[i]);
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  float* tmp = nullptr;
  cudaError_t e = cudaMalloc(&tmp, (size_t)n * sizeof(float));
  if (e != cudaSuccess) return e;
  DISPATCH(a->x.dtype, k<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, tmp, (T*)a->out.data, n));
  e = cudaGetLastError();
  cudaError_t f = cudaFree(tmp);
  return e != cudaSuccess ? e : f;
}
HONEST_BACKWARD
