// spec: gelu_tanh
// expect: timeout
// The bug: a spin wait on a flag nobody sets.
#include "_gelu_common.h"
__device__ int g_flag = 0;
__global__ void spin() { while (*(volatile int*)&g_flag == 0) { } }
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args*, cudaStream_t s) {
  spin<<<1, 1, 0, s>>>();
  return cudaGetLastError();
}
STUB_BACKWARD
