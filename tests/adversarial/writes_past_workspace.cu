// spec: gelu_tanh
// expect: out-of-bounds
// The bug: a float of scratch per element, n * 4 bytes asked for, but every thread of the last
// block writes its slot, also the threads past n (the bound check guards only the output). Up to
// 1020 bytes past the workspace's end are overwritten, in a real program another tensor's bytes
// of the caching allocator. The verifier guards the bytes after the workspace as after outputs.
#include "_gelu_common.h"
template <typename T> __global__ void k(const T* x, T* y, float* tmp, int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  tmp[i] = i < n ? gelu(load(x, i)) : 0.0f;
  if (i < n) store(y, i, tmp[i]);
}
extern "C" size_t gelu_tanh_forward_workspace(const gelu_tanh_args* a) {
  return (size_t)(a->N * a->D) * sizeof(float);
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  int64_t n = a->N * a->D;
  if (n == 0) return cudaSuccess;
  if (a->workspace_bytes < n * (int64_t)sizeof(float)) return cudaErrorInvalidValue;
  const int64_t blocks = (n + 255) / 256;
  DISPATCH(a->x.dtype, k<T><<<(unsigned)blocks, 256, 0, s>>>((const T*)a->x.data, (T*)a->out.data,
                                                               (float*)a->workspace, n));
  return cudaGetLastError();
}
HONEST_BACKWARD
