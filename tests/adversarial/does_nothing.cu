// spec: gelu_tanh
// expect: unwritten-output
// The cheat: returns success without launching anything (the outputs keep whatever was there).
#include "_gelu_common.h"
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args*, cudaStream_t) { return cudaSuccess; }
STUB_BACKWARD
