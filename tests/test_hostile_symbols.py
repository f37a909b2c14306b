"""Issue 14 case 4: the kernel symbol check refuses file, environment, process, network,
dynamic-loading, memory-mapping and signal calls, interposed C library functions, code that
runs when the library is loaded (static constructors) and raw system calls; the committed
kernels stay clean. The CPU tests feed the decision synthetic symbol tables; the nvcc tests
compile small kernels that really call each family (sm_90, no GPU needed)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from specgen.abi import write_header
from specgen.spec import load_spec
from specgen.toolchain import check_symbols, compile_kernel, default_cache_dir
from specgen.toolchain import symbols as symbols_module
from specgen.toolchain.symbols import DynamicSymbol, refused_family

REPO = Path(__file__).resolve().parent.parent
ARCH = "sm_90"

# Every name the issue lists, by family (and glibc's decorated spellings of some).
REFUSED = {
    "files": ["fopen", "fopen64", "open", "open64", "__open_2", "openat", "creat", "read", "__read_chk", "write",
              "unlink", "remove", "rename", "mkdir", "opendir", "readdir", "readdir64", "stat", "stat64", "lstat",
              "fstat", "__xstat64", "statx", "fstatat"],
    "environment": ["getenv", "secure_getenv", "setenv", "putenv", "clearenv", "environ", "__environ",
                    "program_invocation_name", "program_invocation_short_name", "__progname"],
    "processes": ["system", "popen", "execv", "execve", "execvp", "execl", "fork", "vfork", "clone",
                  "posix_spawn", "posix_spawnp", "kill", "raise", "ptrace", "syscall", "prctl"],
    "network": ["socket", "connect", "bind", "listen", "accept", "accept4", "send", "sendto", "sendmsg", "recv",
                "recvfrom", "recvmsg", "__recv_chk"],
    "dynamic loading": ["dlopen", "dlsym", "dlmopen", "dl_iterate_phdr", "dladdr"],
    "memory mapping": ["mmap", "mmap64", "mprotect"],
    "signals": ["signal", "sigaction", "__sysv_signal"],
    "memory kept past a call": ["cudaMalloc", "cudaMallocManaged", "cudaMallocPitch", "cudaMalloc3D",
                                "cudaMallocArray", "cudaMallocHost", "cudaHostAlloc", "cudaHostRegister", "cudaFree",
                                "cudaFreeHost", "cudaFreeArray"],
}
ALLOWED = ["getpid", "memcpy", "__memcpy_chk", "malloc", "free", "printf", "__printf_chk", "fprintf", "fwrite",
           "puts", "exit", "__cxa_atexit", "__cxa_guard_acquire", "clock_gettime", "__stack_chk_fail", "abort",
           "_Unwind_Resume", "__gxx_personality_v0", "cudaMallocAsync", "cudaFreeAsync", "cudaMallocFromPoolAsync",
           "cudaHostGetDevicePointer", "__cudaRegisterFunction", "sqrtf", "expf"]


@pytest.mark.parametrize("family, name", [(f, n) for f, names in REFUSED.items() for n in names])
def test_every_listed_call_is_refused_in_its_family(family, name):
    assert refused_family(name) == family


@pytest.mark.parametrize("name", ALLOWED)
def test_what_kernels_use_stays_allowed(name):
    assert refused_family(name) is None


def fake_library(monkeypatch, undefined=(), defined=(), needed=("libcudart.so.13", "libc.so.6")):
    monkeypatch.setattr(symbols_module, "undefined_dynamic_symbols",
                        lambda lib: [DynamicSymbol(n, v, False) for n, v in undefined])
    monkeypatch.setattr(symbols_module, "defined_symbols", lambda lib: set(defined))
    monkeypatch.setattr(symbols_module, "needed_libraries", lambda lib: list(needed))
    monkeypatch.setattr("specgen.toolchain.loadcode.load_time_code", lambda lib: [])
    monkeypatch.setattr("specgen.toolchain.loadcode.raw_system_calls", lambda lib: [])


def test_check_symbols_names_each_refused_glibc_symbol(monkeypatch):
    names = [n for family in REFUSED.values() for n in family]
    fake_library(monkeypatch, [(n, "GLIBC_2.2.5") for n in names] + [("getpid", "GLIBC_2.2.5"),
                                                                        ("cudaLaunchKernel", "libcudart.so.13")])
    violations = check_symbols(Path("fake.so"))
    assert len(violations) == len(names)
    for name in names:
        assert any(v.startswith(f"{name}@GLIBC_2.2.5: ") and "refused in a kernel" in v for v in violations), name


def test_a_library_defining_libc_or_cudart_functions_is_refused(monkeypatch):
    fake_library(monkeypatch, defined=["scale_forward", "getenv", "malloc", "cudaMalloc", "helper"])
    violations = check_symbols(Path("fake.so"))
    assert sorted(v.split(":")[0] for v in violations) == ["cudaMalloc", "getenv", "malloc"]


# ---------------------------------------------------------------------------- real compiles

def _compile(spec_path: Path, source: str | Path, name: str):
    spec = load_spec(spec_path)
    with tempfile.TemporaryDirectory() as header_dir:
        write_header(spec, header_dir)
        return spec, compile_kernel(source, include_dirs=[Path(header_dir)], arch=ARCH, name=name,
                                    cache_dir=default_cache_dir())


COMMITTED = sorted((REPO / "specs" / "kernels").glob("*.cu")) + sorted((REPO / "tests" / "kernels").glob("*.cu"))


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("kernel", COMMITTED, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_committed_kernels_stay_clean(kernel):
    op = kernel.stem.split("__")[0]  # tests/kernels/<op>__<variant>.cu
    spec, compiled = _compile(REPO / "specs" / f"{op}.yaml", kernel, op)
    assert check_symbols(compiled.library, spec.libraries) == []


SCALE_SPEC = """\
name: scale
description: Multiply by alpha.
signature: "scale(x: Tensor[N, D], alpha: float = 2.0) -> Tensor[N, D]"
dtypes: [float32]
dims: {N: [1, 64], D: [1, 64]}
reference: |
  def reference(x, alpha=2.0):
      return x * alpha
"""

KERNEL = """\
#include <cuda_runtime.h>
#include "scale_abi.h"
%(includes)s
volatile long sink;
__global__ void scale_kernel(const float* x, float* y, double alpha, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = (float)(x[i] * alpha);
}
%(globals)s
extern "C" cudaError_t scale_forward(const scale_args* a, cudaStream_t stream) {
  long n = a->N * a->D;
  %(calls)s
  scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((const float*)a->x.data, (float*)a->out.data,
                                                                a->alpha, n);
  return cudaGetLastError();
}
"""

FAMILIES = {
    "files": ("#include <cstdio>\n#include <fcntl.h>\n#include <unistd.h>\n#include <sys/stat.h>\n#include <dirent.h>",
              "", """
  FILE* f = fopen("/tmp/specgen-x", "r"); sink += (long)f;
  int fd = open("/tmp/specgen-x", O_RDONLY) + openat(AT_FDCWD, "x", O_RDONLY) + creat("x", 0600);
  char b[4]; sink += read(fd, b, 4) + write(fd, b, 4);
  sink += unlink("x") + remove("x") + rename("a", "b") + mkdir("d", 0700);
  DIR* d = opendir("."); sink += (long)readdir(d);
  struct stat st; sink += stat("x", &st);""",
              ["fopen", "open", "openat", "creat", "read", "write", "unlink", "remove", "rename", "mkdir", "opendir",
               "readdir", "stat"]),
    "environment": ("#include <cstdlib>\n#include <errno.h>\nextern char** environ;", "", """
  sink += (long)getenv("HOME") + (long)secure_getenv("HOME") + setenv("A", "b", 1) + putenv((char*)"A=b");
  sink += clearenv() + (long)environ + (long)program_invocation_name + (long)program_invocation_short_name;""",
                    ["getenv", "secure_getenv", "setenv", "putenv", "clearenv", "environ", "program_invocation_name",
                     "program_invocation_short_name"]),
    "processes": ("#include <cstdlib>\n#include <cstdio>\n#include <unistd.h>\n#include <signal.h>\n"
                  "#include <spawn.h>\n#include <sys/ptrace.h>\n#include <sys/syscall.h>\n#include <sys/prctl.h>",
                  "", """
  sink += system("true") + (long)popen("true", "r") + fork() + vfork() + execve("/bin/true", 0, 0);
  pid_t pid; sink += posix_spawn(&pid, "/bin/true", 0, 0, 0, 0) + kill(0, 0) + raise(0);
  sink += ptrace(PTRACE_TRACEME, 0, 0, 0) + syscall(SYS_execve, "/bin/true", 0, 0) + prctl(PR_GET_NAME, 0);""",
                  ["system", "popen", "fork", "vfork", "execve", "posix_spawn", "kill", "raise", "ptrace", "syscall",
                   "prctl"]),
    "network": ("#include <sys/socket.h>", "", """
  int s = socket(AF_INET, SOCK_STREAM, 0); char b[4];
  sink += connect(s, 0, 0) + bind(s, 0, 0) + listen(s, 1) + accept(s, 0, 0) + send(s, b, 4, 0) + recv(s, b, 4, 0);""",
                ["socket", "connect", "bind", "listen", "accept", "send", "recv"]),
    "dynamic loading": ("#include <dlfcn.h>\n#include <link.h>", "", """
  void* h = dlopen("libm.so.6", RTLD_NOW); sink += (long)dlsym(h, "cos") + (long)dlmopen(LM_ID_NEWLM, "x", 0);
  Dl_info info; sink += dladdr((void*)&sink, &info) + dl_iterate_phdr(0, 0);""",
                        ["dlopen", "dlsym", "dlmopen", "dladdr", "dl_iterate_phdr"]),
    "memory mapping": ("#include <sys/mman.h>", "", """
  void* p = mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); sink += mprotect(p, 4096, PROT_NONE);""",
                       ["mmap", "mprotect"]),
    "signals": ("#include <signal.h>", "static void on_signal(int) {}", """
  signal(SIGINT, on_signal); struct sigaction sa = {}; sink += sigaction(SIGINT, &sa, 0);""",
                ["signal", "sigaction"]),
    "memory kept past a call": ("", "static void* g_kept = nullptr;", """
  void* p = nullptr; size_t pitch = 0; cudaPitchedPtr pitched;
  sink += cudaMalloc(&g_kept, 4) + cudaMallocManaged(&p, 4) + cudaMallocPitch(&p, &pitch, 4, 4);
  sink += cudaMalloc3D(&pitched, make_cudaExtent(4, 4, 4)) + cudaMallocHost(&p, 4) + cudaHostAlloc(&p, 4, 0);
  sink += cudaHostRegister(p, 8, 0) + cudaFree(p) + cudaFreeHost(p);""",
                                ["cudaMalloc", "cudaMallocManaged", "cudaMallocPitch", "cudaMalloc3D",
                                 "cudaMallocHost", "cudaHostAlloc", "cudaHostRegister", "cudaFree", "cudaFreeHost"]),
}


@pytest.fixture(scope="module")
def scale_spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "scale.yaml"
    path.write_text(SCALE_SPEC)
    return path


@pytest.mark.nvcc
@pytest.mark.slow
def test_the_template_kernel_itself_is_clean(scale_spec):
    spec, compiled = _compile(scale_spec, KERNEL % {"includes": "", "globals": "", "calls": ""}, "scale_clean")
    assert check_symbols(compiled.library, spec.libraries) == []


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_kernel_calling_a_refused_family_is_refused(scale_spec, family):
    includes, globals_, calls, names = FAMILIES[family]
    spec, compiled = _compile(scale_spec, KERNEL % {"includes": includes, "globals": globals_, "calls": calls},
                              f"scale_{family.replace(' ', '_')}")
    violations = check_symbols(compiled.library, spec.libraries)
    reason = symbols_module._REFUSED_FAMILIES[family][0]
    for name in names:
        assert any(v.split("@")[0].split(":")[0].lstrip("_").startswith(name) and reason in v
                   for v in violations), (name, violations)


@pytest.mark.nvcc
def test_stream_ordered_allocation_stays_allowed(scale_spec):
    """cudaMallocAsync/cudaFreeAsync on `stream`: kernels written before the workspace allocate per call
    with them (tests/kernels/rmsnorm.cu); only memory kept past a call is refused."""
    calls = "void* p = nullptr; sink += cudaMallocAsync(&p, 4, stream) + cudaFreeAsync(p, stream);"
    spec, compiled = _compile(scale_spec, KERNEL % {"includes": "", "globals": "", "calls": calls}, "scale_async")
    assert check_symbols(compiled.library, spec.libraries) == []


CONSTRUCTORS = """
#include <cstdio>
__attribute__((constructor)) static void runs_at_load() { sink = 1; }
__attribute__((destructor)) static void runs_at_unload() { sink = 2; }
struct Global { Global() { sink = 3; } };
static Global global_object;
static void pointed_at() { sink = 4; }
__attribute__((section(".init_array"), used)) static void (*init_pointer)() = pointed_at;
"""


@pytest.mark.nvcc
@pytest.mark.slow
def test_code_that_runs_when_the_library_loads_is_refused(scale_spec):
    spec, compiled = _compile(scale_spec, KERNEL % {"includes": "", "globals": CONSTRUCTORS, "calls": ""},
                              "scale_constructors")
    violations = check_symbols(compiled.library, spec.libraries)
    text = "\n".join(violations)
    assert "runs_at_load" in text and "pointed_at" in text and "_GLOBAL__sub_I" in text, text
    assert "runs_at_unload" in text and "is unloaded" in text, text


@pytest.mark.nvcc
@pytest.mark.slow
def test_code_added_to_init_and_raw_system_calls_are_refused(scale_spec):
    globals_ = ('asm(".section .init\\n\\tcall init_hook@PLT\\n\\t.previous");\n'
                'extern "C" void init_hook() { sink = 5; }\n')
    calls = 'long r; asm volatile("syscall" : "=a"(r) : "a"(39) : "rcx", "r11", "memory"); sink += r;'
    spec, compiled = _compile(scale_spec, KERNEL % {"includes": "", "globals": globals_, "calls": calls},
                              "scale_asm")
    text = "\n".join(check_symbols(compiled.library, spec.libraries))
    assert ".init: code added" in text and "system call instruction" in text, text


@pytest.mark.nvcc
@pytest.mark.slow
def test_bench_refuses_to_load_a_kernel_with_a_static_constructor(scale_spec, tmp_path, capsys):
    from specgen.cli import main

    kernel = tmp_path / "ctor.cu"
    kernel.write_text(KERNEL % {"includes": "", "globals": CONSTRUCTORS, "calls": ""})
    assert main(["bench", str(scale_spec), "--kernel", str(kernel), "--arch", ARCH, "--shape", "N=4,D=4"]) == 1
    err = capsys.readouterr().err
    assert "not timed" in err and "runs_at_load" in err
