// spec: gelu_tanh
// expect: forbidden-symbol
// (Refused statically once the symbol check refused dl_iterate_phdr; before that, on the H200 on
// 2026-12-01, the isolated verifier rejected it as unwritten-output: it patched nothing that judges.)
// The cheat: a static constructor finds the Python C API in the process that loads the library
// -- walking the loaded objects' dynamic symbol tables itself (dl_iterate_phdr + GNU hash), so no
// Py* or dl* import shows in its symbols -- and runs Python that turns the verifier's checks into
// no-ops. The kernel then writes nothing. In a runner process there is no check to patch: the
// outputs are judged elsewhere, and they were never written.
#include <link.h>
#include <cstring>
#include "_gelu_common.h"
struct Want { const char* name; void* addr; };
static int find(struct dl_phdr_info* info, size_t, void* p) {
  Want* want = (Want*)p;
  uint32_t h = 5381;
  for (const char* c = want->name; *c; ++c) h = h * 33 + (unsigned char)*c;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
    const ElfW(Sym)* sym = nullptr; const char* str = nullptr; const uint32_t* gnu = nullptr;
    for (auto* d = (const ElfW(Dyn)*)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr); d->d_tag != DT_NULL; ++d) {
      uintptr_t v = d->d_un.d_ptr < info->dlpi_addr ? d->d_un.d_ptr + info->dlpi_addr : d->d_un.d_ptr;
      if (d->d_tag == DT_SYMTAB) sym = (const ElfW(Sym)*)v;
      if (d->d_tag == DT_STRTAB) str = (const char*)v;
      if (d->d_tag == DT_GNU_HASH) gnu = (const uint32_t*)v;
    }
    if (!sym || !str || !gnu) continue;
    const uint32_t* buckets = gnu + 4 + gnu[2] * (sizeof(ElfW(Addr)) / 4);
    const uint32_t* chain = buckets + gnu[0] - gnu[1];
    for (uint32_t k = buckets[h % gnu[0]]; k != 0; ++k) {
      if ((chain[k] | 1) == (h | 1) && sym[k].st_shndx && !strcmp(str + sym[k].st_name, want->name)) {
        want->addr = (void*)(info->dlpi_addr + sym[k].st_value);
        return 1;
      }
      if (chain[k] & 1) break;
    }
  }
  return 0;
}
static void* lookup(const char* name) { Want w{name, nullptr}; dl_iterate_phdr(find, &w); return w.addr; }
__attribute__((constructor)) static void patch_the_verifier() {
  auto ensure = (int (*)())lookup("PyGILState_Ensure");
  auto release = (void (*)(int))lookup("PyGILState_Release");
  auto run = (int (*)(const char*))lookup("PyRun_SimpleString");
  if (!ensure || !release || !run) return;
  int gil = ensure();
  run("import sys\n"
      "for m in ('specgen.verify.engine', 'specgen.verify.checks'):\n"
      "    m = sys.modules.get(m)\n"
      "    for f in ('check_case', 'check_stream_discipline', 'check_deterministic_repeats', 'check_after_timing',\n"
      "              'check_close', 'check_all_written', 'check_same_bits', 'check_inputs_unchanged'):\n"
      "        if m is not None and hasattr(m, f): setattr(m, f, lambda *a, **k: {})\n");
  release(gil);
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args*, cudaStream_t) { return cudaSuccess; }
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args*, cudaStream_t) { return cudaSuccess; }
