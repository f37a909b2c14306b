// spec: gelu_tanh
// expect: wrong-result
// The cheat: a pre-pass finds the largest |x| of the whole input; a tile of 1024 elements whose
// every value is below 1% of it is "negligible" and gets the linear approximation 0.5 * x
// (sold as a fast path for the tiny activations around a model's outliers). With i.i.d. test
// values of any one scale no such tile ever exists, so only the exact path is seen; with a
// model's activations (rare elements 1e3-1e4 times the rest) most tiles are taken and wrong.
#include "_gelu_common.h"
__device__ unsigned int g_absmax_bits;
template <typename T> __global__ void absmax(const T* x, int64_t n) {
  float m = 0.0f;
  GRID_STRIDE(i, n) {
    float v = fabsf(load(x, i));
    if (v == v && v != INFINITY) m = fmaxf(m, v);
  }
  atomicMax(&g_absmax_bits, __float_as_uint(m));  // non-negative floats order as their bits
}
template <typename T> __global__ void tiles(const T* x, T* y, int64_t n) {
  const int64_t base = (int64_t)blockIdx.x * 1024;
  const float cut = 0.01f * __uint_as_float(g_absmax_bits);
  bool small = true;
  for (int j = threadIdx.x; j < 1024; j += blockDim.x)
    if (base + j < n && !(fabsf(load(x, base + j)) < cut)) small = false;
  small = __syncthreads_and(small);
  for (int j = threadIdx.x; j < 1024; j += blockDim.x) {
    int64_t i = base + j;
    if (i < n) {
      float v = load(x, i);
      store(y, i, small ? 0.5f * v : gelu(v));
    }
  }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  void* bits = nullptr;
  cudaError_t e = cudaGetSymbolAddress(&bits, g_absmax_bits);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync(bits, 0, sizeof(unsigned int), s);
  if (e != cudaSuccess) return e;
  DISPATCH(a->x.dtype, absmax<T><<<blocks_for(n), 256, 0, s>>>((const T*)a->x.data, n));
  DISPATCH(a->x.dtype, tiles<T><<<(unsigned)((n + 1023) / 1024), 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
