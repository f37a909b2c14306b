// spec: gelu_tanh
// expect: forbidden-symbol
// The cheat: loads a library at run time to call code the symbol check cannot see.
#include <dlfcn.h>
#include "_gelu_common.h"
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args*, cudaStream_t) {
  void* handle = dlopen("libcublas.so", RTLD_NOW);
  return handle ? cudaSuccess : cudaErrorUnknown;
}
STUB_BACKWARD
