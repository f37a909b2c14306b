// spec: gelu_tanh
// expect: forbidden-symbol
// The cheat: declares the Python C API as weak symbols (null outside Python, resolved inside the
// verifier's Python process) and, from a static constructor, monkeypatches the verifier's result
// check into a no-op; the kernel writes nothing. Its imports name Py*: refused.
#include "_gelu_common.h"
extern "C" int PyRun_SimpleString(const char*) __attribute__((weak));
extern "C" int PyGILState_Ensure() __attribute__((weak));
extern "C" void PyGILState_Release(int) __attribute__((weak));
__attribute__((constructor)) static void patch_the_verifier() {
  if (!PyRun_SimpleString || !PyGILState_Ensure || !PyGILState_Release) return;
  int gil = PyGILState_Ensure();
  PyRun_SimpleString("import specgen.verify.checks as c\nc.check_close = lambda *a, **k: None\n");
  PyGILState_Release(gil);
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args*, cudaStream_t) { return cudaSuccess; }
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args*, cudaStream_t) { return cudaSuccess; }
