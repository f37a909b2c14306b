// spec: gelu_tanh
// expect: compile-error
// The bug: does not compile (an undeclared identifier).
#include "_gelu_common.h"
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t s) {
  return launch_the_kernel(a, s);
}
STUB_BACKWARD
