// spec: gelu_tanh
// expect: entry-point-missing
// The bug: the entry point has C++ linkage (no extern "C") and a wrong name.
#include "_gelu_common.h"
cudaError_t gelu_forward(const gelu_tanh_args*, cudaStream_t) { return cudaSuccess; }
STUB_BACKWARD
