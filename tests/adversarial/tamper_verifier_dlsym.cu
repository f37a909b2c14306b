// spec: gelu_tanh
// expect: forbidden-symbol
// The cheat: the same verifier patch as tamper_verifier_pyrun_phdr.cu, but finding the Python C API
// the ordinary way, dlsym(RTLD_DEFAULT, ...); the kernel writes nothing.
#include <dlfcn.h>
#include "_gelu_common.h"
__attribute__((constructor)) static void patch_the_verifier() {
  auto ensure = (int (*)())dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
  auto release = (void (*)(int))dlsym(RTLD_DEFAULT, "PyGILState_Release");
  auto run = (int (*)(const char*))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
  if (!ensure || !release || !run) return;
  int gil = ensure();
  run("import sys\n"
      "m = sys.modules.get('specgen.verify.checks')\n"
      "if m is not None: m.check_close = m.check_all_written = m.check_same_bits = lambda *a, **k: None\n");
  release(gil);
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args*, cudaStream_t) { return cudaSuccess; }
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args*, cudaStream_t) { return cudaSuccess; }
