"""The CUDA toolchain: finding the toolkit, cached compiles, diagnostics, symbol checks."""
from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from specgen import toolchain
from specgen.toolchain import cuda as toolchain_cuda
from specgen.toolchain import diagnostics as toolchain_diagnostics
from specgen.errors import EXIT_ENVIRONMENT, EXIT_REJECTED, EnvironmentMissing, UsageError
from specgen.toolchain import (
    CompileError, Diagnostic, check_symbols, compile_kernel, find_cuda_toolkit, needed_libraries,
    parse_diagnostics, parse_module_memory, parse_resources, undefined_symbols,
)

REPO = Path(__file__).resolve().parent.parent

ADD_ONE = """\
#include <cuda_runtime.h>
__global__ void add_one(float* x, int n) {
  __shared__ float tile[128];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { tile[threadIdx.x % 128] = x[i]; x[i] = tile[threadIdx.x % 128] + 1.0f; }
}
extern "C" cudaError_t run(float* x, int n, cudaStream_t s) {
  add_one<<<(n + 255) / 256, 256, 0, s>>>(x, n);
  return cudaGetLastError();
}
"""

SYNTAX_ERROR = """\
#include <cuda_runtime.h>
__global__ void k(float* x) {
  x[0] = 1.0f;
  x[1] = foo;
}
"""

CALLS_CUBLAS = """\
#include <cuda_runtime.h>
typedef void* cublasHandle_t;
extern "C" int cublasSgemm_v2(cublasHandle_t, int, int, int, int, int, const float*, const float*, int,
                              const float*, int, const float*, float*, int);
extern "C" int run(cublasHandle_t h, const float* a, const float* b, float* c, int n) {
  const float one = 1.0f, zero = 0.0f;
  return cublasSgemm_v2(h, 0, 0, n, n, n, &one, a, n, b, n, &zero, c, n);
}
"""

CALLS_DLOPEN = """\
#include <cuda_runtime.h>
#include <dlfcn.h>
extern "C" int run() {
  void* lib = dlopen("libcublas.so", RTLD_NOW);
  return lib != nullptr && dlsym(lib, "cublasSgemm_v2") != nullptr;
}
"""


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    # Never touch the user's real cache from a test.
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "default-cache"))


@pytest.fixture(scope="module")
def clean_library(tmp_path_factory) -> Path:
    return compile_kernel(ADD_ONE, cache_dir=tmp_path_factory.mktemp("cache"), arch="sm_90").library


# --------------------------------------------------------------------------- finding the toolkit


@pytest.mark.nvcc
def test_finds_the_toolkit_with_headers_and_cudart(monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    toolkit = find_cuda_toolkit()
    if Path("/usr/local/cuda").exists():
        assert toolkit.root == Path("/usr/local/cuda").resolve()  # the symlink resolved, e.g. cuda-13.0
    assert toolkit.nvcc == toolkit.root / "bin" / "nvcc"
    assert (toolkit.include_dir / "cuda_runtime.h").is_file()
    assert toolkit.cudart.name == "libcudart.so" and toolkit.cudart.exists()
    assert toolkit.version.count(".") == 1 and toolkit.release.startswith(toolkit.version)


@pytest.mark.nvcc
def test_nvcc_wrapper_script_on_path_reports_the_real_root(tmp_path):
    real = find_cuda_toolkit()
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real.nvcc} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    # dirname(wrapper)/.. is tmp_path, which holds no toolkit: the root must come from nvcc itself.
    assert toolchain_cuda._ask_nvcc_for_root(wrapper) == real.root


def test_bogus_cuda_home_is_an_error_naming_what_is_missing(tmp_path, monkeypatch):
    # An explicit CUDA_HOME wins over every other place; a broken one is reported, not skipped.
    bogus = tmp_path / "cuda"
    (bogus / "bin").mkdir(parents=True)
    monkeypatch.setenv("CUDA_HOME", str(bogus))
    with pytest.raises(EnvironmentMissing) as caught:
        find_cuda_toolkit()
    message = str(caught.value)
    assert f"$CUDA_HOME={bogus}" in message
    for missing in ("bin/nvcc", "cuda_runtime.h", "libcudart.so"):
        assert missing in message
    assert "Set CUDA_HOME" in message
    assert caught.value.exit_code == EXIT_ENVIRONMENT


def test_cuda_home_that_does_not_exist_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(EnvironmentMissing, match="nowhere is not a folder"):
        find_cuda_toolkit()


def test_no_toolkit_anywhere_lists_every_place_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc here
    monkeypatch.setattr(toolchain_cuda, "DEFAULT_CUDA_ROOT", tmp_path / "cuda")
    with pytest.raises(EnvironmentMissing) as caught:
        find_cuda_toolkit()
    message = str(caught.value)
    assert str(tmp_path / "cuda") in message and "no nvcc" in message and "CUDA_HOME" in message


@pytest.mark.nvcc
def test_cuda_path_is_used_when_cuda_home_is_unset(monkeypatch):
    real = find_cuda_toolkit()
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("CUDA_PATH", str(real.root))
    monkeypatch.setattr(toolchain_cuda, "DEFAULT_CUDA_ROOT", Path("/nonexistent/cuda"))
    assert find_cuda_toolkit().root == real.root


def test_gpu_arch_from_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "9.0"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert toolchain_cuda._arch_from_nvidia_smi() == "sm_90"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert toolchain_cuda._arch_from_nvidia_smi() is None


def test_gpu_arch_from_the_toolkit_device_query(tmp_path):
    works, fails = tmp_path / "works", tmp_path / "fails"
    works.write_text('#!/bin/sh\necho "100,90"\n')
    fails.write_text('#!/bin/sh\necho "failed to call load_driver_entries()" >&2\nexit 1\n')
    for tool in (works, fails):
        tool.chmod(0o755)
    assert toolchain_cuda._arch_from_device_query(works) == "sm_100"
    assert toolchain_cuda._arch_from_device_query(fails) is None


@pytest.mark.gpu
def test_detected_arch_is_the_visible_gpus():
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    toolchain.detect_gpu_arch.cache_clear()
    assert toolchain.detect_gpu_arch() == f"sm_{major}{minor}"


# --------------------------------------------------------------------------- compiling and the cache


@pytest.mark.nvcc
def test_compile_then_cache_hit_then_miss_on_changed_source(tmp_path):
    first = compile_kernel(ADD_ONE, cache_dir=tmp_path, arch="sm_90")
    assert not first.cached and first.library.is_file() and first.library.parent == tmp_path
    kernel = first.resources["add_one(float*, int)"]
    assert kernel["registers"] > 0 and kernel["shared_bytes"] == 512 and kernel["spill_store_bytes"] == 0

    again = compile_kernel(ADD_ONE, cache_dir=tmp_path, arch="sm_90")
    assert again.cached and again.library == first.library
    assert again.seconds < first.seconds / 10
    assert again.resources == first.resources  # the report survives the cache

    changed = compile_kernel(ADD_ONE.replace("1.0f", "2.0f"), cache_dir=tmp_path, arch="sm_90")
    assert not changed.cached and changed.library != first.library and changed.source_hash != first.source_hash
    # Atomic writes leave no partial files behind.
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


TABLE_AND_SCRATCH = """\
#include <cuda_runtime.h>
__device__ const float table[1024] = {1.0f, 2.0f};  // 4096 bytes, read-only: gmem all the same
__device__ float scratch[%d];
__constant__ float bank[4096];  // constant memory: not gmem
__global__ void k(float* x) { x[threadIdx.x] = table[threadIdx.x] + scratch[threadIdx.x] + bank[threadIdx.x]; }
extern "C" cudaError_t run(float* x, cudaStream_t s) { k<<<1, 32, 0, s>>>(x); return cudaGetLastError(); }
"""


@pytest.mark.nvcc
def test_module_memory_is_recorded_and_survives_the_cache(tmp_path):
    """ptxas's `bytes gmem`: every `__device__` variable, `const` or not; `__constant__` is not."""
    assert compile_kernel(ADD_ONE, cache_dir=tmp_path, arch="sm_90").module_memory_bytes == 0
    first = compile_kernel(TABLE_AND_SCRATCH % 65536, cache_dir=tmp_path, arch="sm_90")
    assert first.module_memory_bytes == 4096 + 4 * 65536
    again = compile_kernel(TABLE_AND_SCRATCH % 65536, cache_dir=tmp_path, arch="sm_90")
    assert again.cached and again.module_memory_bytes == first.module_memory_bytes

    # A cache entry written before the field existed: read from the ptxas log it kept.
    meta_path = first.library.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    del meta["module_memory_bytes"]
    meta_path.write_text(json.dumps(meta))
    old = compile_kernel(TABLE_AND_SCRATCH % 65536, cache_dir=tmp_path, arch="sm_90")
    assert old.cached and old.module_memory_bytes == first.module_memory_bytes
    # Its report lost: built again rather than judged blind.
    meta_path.unlink()
    rebuilt = compile_kernel(TABLE_AND_SCRATCH % 65536, cache_dir=tmp_path, arch="sm_90")
    assert not rebuilt.cached and rebuilt.module_memory_bytes == first.module_memory_bytes
    assert meta_path.exists()


@pytest.mark.nvcc
def test_cache_key_covers_included_headers_but_not_their_folder(tmp_path):
    source = '#include <cuda_runtime.h>\n#include "scale.h"\nextern "C" float f() { return SCALE; }\n'
    headers = tmp_path / "h1"
    headers.mkdir()
    (headers / "scale.h").write_text("#define SCALE 2.0f\n")
    cache = tmp_path / "cache"
    first = compile_kernel(source, include_dirs=[headers], cache_dir=cache, arch="sm_90")

    same_header_elsewhere = tmp_path / "h2"
    same_header_elsewhere.mkdir()
    (same_header_elsewhere / "scale.h").write_text("#define SCALE 2.0f\n")
    assert compile_kernel(source, include_dirs=[same_header_elsewhere], cache_dir=cache, arch="sm_90").cached

    (same_header_elsewhere / "scale.h").write_text("#define SCALE 3.0f\n")
    edited = compile_kernel(source, include_dirs=[same_header_elsewhere], cache_dir=cache, arch="sm_90")
    assert not edited.cached and edited.library != first.library


@pytest.mark.nvcc
def test_header_next_to_a_source_file_is_found_and_hashed(tmp_path):
    kernel = tmp_path / "k.cu"
    kernel.write_text('#include "local.h"\nextern "C" int f() { return LOCAL; }\n')
    (tmp_path / "local.h").write_text("#define LOCAL 1\n")
    first = compile_kernel(kernel, cache_dir=tmp_path / "cache", arch="sm_90")
    (tmp_path / "local.h").write_text("#define LOCAL 2\n")
    second = compile_kernel(kernel, cache_dir=tmp_path / "cache", arch="sm_90")
    assert not second.cached and second.library != first.library


@pytest.mark.nvcc
def test_two_processes_compiling_the_same_kernel_both_get_a_whole_library(tmp_path):
    import subprocess
    import sys

    (tmp_path / "k.cu").write_text(ADD_ONE)
    script = ("import sys; from pathlib import Path; from specgen.toolchain import compile_kernel; "
              "print(compile_kernel(Path(sys.argv[1]), cache_dir=Path(sys.argv[2]), arch='sm_90').library)")
    command = [sys.executable, "-c", script, str(tmp_path / "k.cu"), str(tmp_path / "cache")]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0].strip() for p in processes]
    assert all(p.returncode == 0 for p in processes) and outputs[0] == outputs[1]
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.suffix == ".so"] == [Path(outputs[0]).name]
    assert undefined_symbols(Path(outputs[0]))  # a readable ELF file, not half of one


@pytest.mark.nvcc
def test_syntax_error_raises_compile_error_with_line_and_message(tmp_path):
    kernel = tmp_path / "broken.cu"
    kernel.write_text(SYNTAX_ERROR)
    with pytest.raises(CompileError) as caught:
        compile_kernel(kernel, cache_dir=tmp_path / "cache", arch="sm_90", source_name="kernels/broken.cu")
    error = caught.value
    assert error.exit_code == EXIT_REJECTED
    first = error.diagnostics[0]
    assert (first.file, first.line, first.severity) == ("kernels/broken.cu", 4, "error")
    assert first.message == 'identifier "foo" is undefined'
    assert first.column == 10  # the caret under `foo`
    text = str(error)
    assert 'kernels/broken.cu:4: error: identifier "foo" is undefined' in text
    assert "x[1] = foo;" in text  # the offending line, for the reader
    assert "tmp" not in text.split("\n", 1)[1]  # no temp build paths leak into what an agent sees
    assert "foo" in error.log
    assert not list((tmp_path / "cache").glob("*.so"))


@pytest.mark.nvcc
def test_compile_timeout_is_a_compile_error(tmp_path):
    with pytest.raises(CompileError, match="timed out"):
        compile_kernel(ADD_ONE, cache_dir=tmp_path, arch="sm_90", timeout=0.05)


@pytest.mark.nvcc
def test_bad_arch_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="sm_90"):
        compile_kernel(ADD_ONE, cache_dir=tmp_path, arch="hopper")


# --------------------------------------------------------------------------- symbols


@pytest.mark.nvcc
def test_clean_kernel_passes_the_symbol_check(clean_library):
    assert "cudaGetLastError" in undefined_symbols(clean_library)
    assert any(name.startswith("libcudart.so") for name in needed_libraries(clean_library))
    assert check_symbols(clean_library) == []


def _cublas_link_flags() -> list[str]:
    """Link flags for a real libcublas, if this machine has one (toolkit or the nvidia pip wheels)."""
    folders = [find_cuda_toolkit().cudart.parent]
    try:
        import nvidia  # the pip CUDA wheels (torch's dependencies)
        folders += [Path(p) for p in nvidia.__path__]
    except ImportError:
        pass
    for folder in folders:
        for candidate in sorted(folder.glob("**/libcublas.so*")):
            return [f"-L{candidate.parent}", f"-l:{candidate.name}"]
    return []  # unlinked, cublasSgemm_v2 stays an unversioned undefined symbol: still refused


@pytest.mark.nvcc
def test_kernel_calling_cublas_is_refused_unless_the_spec_allows_it(tmp_path):
    flags = _cublas_link_flags()
    library = compile_kernel(CALLS_CUBLAS, cache_dir=tmp_path, arch="sm_90", extra_flags=flags).library
    violations = check_symbols(library)
    assert any(v.startswith("cublasSgemm_v2") and "cublas" in v and "libraries" in v for v in violations)
    if flags:
        assert any(v.startswith("libcublas.so") for v in violations)  # the DT_NEEDED entry too
    assert check_symbols(library, allowed_libraries=["cublas"]) == []


@pytest.mark.nvcc
def test_kernel_calling_dlopen_is_refused(tmp_path):
    library = compile_kernel(CALLS_DLOPEN, cache_dir=tmp_path, arch="sm_90").library
    violations = check_symbols(library, allowed_libraries=["cublas"])  # allowing a library never allows dlopen
    refused = {v.split(":")[0].split("@")[0] for v in violations}
    assert {"dlopen", "dlsym"} <= refused
    assert all("loads code at run time" in v for v in violations if v.startswith(("dlopen", "dlsym")))


# --------------------------------------------------------------------------- parsing nvcc output


EDG_OUTPUT = """\
kernel.cu(4): error: identifier "foo" is undefined
    x[0] = foo;
           ^

kernel.cu(7): warning #177-D: variable "unused" was declared but never referenced
    int unused = 3;
        ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

1 error detected in the compilation of "kernel.cu".
"""

PTXAS_OUTPUT = """\
ptxas error   : Entry function '_Z3bigPf' uses too much shared data (0x61a80 bytes, 0xc000 max)
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3bigPf' for 'sm_90'
ptxas info    : Function properties for _Z3bigPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 400000 bytes smem
ptxas info    : Compile time = 1.125 ms
ptxas info    : Compiling entry function '_Z5spillPf' for 'sm_90'
ptxas info    : Function properties for _Z5spillPf
    1024 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes cumulative stack size
"""

LINKER_OUTPUT = """\
/usr/bin/ld: /tmp/tmpxft_00001291_00000000-11_link.o: in function `run':
tmpxft_00001291_00000000-6_link.cudafe1.cpp:(.text+0x15): undefined reference to `missing_fn'
/usr/bin/ld: cannot find -lcublas: No such file or directory
collect2: error: ld returned 1 exit status
"""

GCC_OUTPUT = """\
kernel.cu:1:10: fatal error: nothere.h: No such file or directory
    1 | #include "nothere.h"
      |          ^~~~~~~~~~~
compilation terminated.
nvcc fatal   : Unsupported gpu architecture 'compute_1000'
"""


def test_parses_front_end_errors_and_warnings_with_columns():
    error, warning = parse_diagnostics(EDG_OUTPUT)
    assert (error.file, error.line, error.column, error.severity) == ("kernel.cu", 4, 10, "error")
    assert error.message == 'identifier "foo" is undefined' and error.source_line == "  x[0] = foo;"
    assert (warning.line, warning.column, warning.severity) == (7, 7, "warning")
    assert warning.message == 'variable "unused" was declared but never referenced'  # number dropped


def test_parses_ptxas_errors_and_resources():
    [error] = parse_diagnostics(PTXAS_OUTPUT)
    assert error.severity == "error" and error.line is None and "too much shared data" in error.message
    assert str(error).startswith("error: ptxas: Entry function")
    resources = parse_resources(PTXAS_OUTPUT)
    by_mangled = {info["mangled"]: info for info in resources.values()}
    assert by_mangled["_Z3bigPf"]["shared_bytes"] == 400000 and by_mangled["_Z3bigPf"]["registers"] == 10
    spill = by_mangled["_Z5spillPf"]
    assert (spill["registers"], spill["stack_bytes"], spill["spill_store_bytes"], spill["spill_load_bytes"]) == (
        255, 1024, 8, 12)
    if shutil.which("c++filt"):
        assert "spill(float*)" in resources


def test_parses_module_memory():
    assert parse_module_memory(PTXAS_OUTPUT) == 0
    log = ("ptxas info    : 262144 bytes gmem\n" + PTXAS_OUTPUT.split("\n", 2)[2]
           + "ptxas info    : 1048576 bytes gmem, 64 bytes cmem[3]\n")
    assert parse_module_memory(log) == 1048576  # the largest of the ptxas runs; older ptxas's cmem suffix
    # A line the candidate prints itself (`#pragma message`) never hides ptxas's own, larger one.
    injected = ('k.cu(2): remark #20200-D: #pragma message: "x\nptxas info    : 0 bytes gmem"\n'
                "ptxas info    : 262144 bytes gmem\n")
    assert parse_module_memory(injected) == 262144
    assert parse_module_memory("  not ptxas info    : 99 bytes gmem") is None
    assert parse_module_memory(LINKER_OUTPUT) is None
    assert "gmem" not in str(parse_resources(log))  # the per-kernel table keeps its shape


def test_parses_linker_errors():
    diagnostics = parse_diagnostics(LINKER_OUTPUT)
    messages = [d.message for d in diagnostics]
    assert messages == ["undefined reference to `missing_fn' (link error)",
                        "linker: cannot find -lcublas: No such file or directory"]
    assert all(d.severity == "error" and d.file is None for d in diagnostics)


def test_parses_host_compiler_and_nvcc_errors():
    missing_header, bad_arch = parse_diagnostics(GCC_OUTPUT)
    assert (missing_header.file, missing_header.line, missing_header.column) == ("kernel.cu", 1, 10)
    assert missing_header.severity == "error" and missing_header.message == "nothere.h: No such file or directory"
    assert missing_header.source_line == '#include "nothere.h"'
    assert bad_arch.message == "nvcc: Unsupported gpu architecture 'compute_1000'"


def test_diagnostic_text_is_file_line_severity_message():
    assert str(Diagnostic(12, 3, "error", 'identifier "foo" is undefined', "kernel.cu")) == \
        'kernel.cu:12: error: identifier "foo" is undefined'
    assert str(Diagnostic(None, None, "warning", "ptxas: x", None)) == "warning: ptxas: x"


def test_compile_error_text_is_short_and_errors_first():
    diagnostics = [Diagnostic(i, None, "warning", "w" * 1000, "k.cu") for i in range(5)]
    diagnostics += [Diagnostic(100 + i, None, "error", f"e{i}", "k.cu") for i in range(30)]
    text = str(CompileError("nvcc failed:", diagnostics, log="full log"))
    lines = text.splitlines()
    assert lines[0] == "nvcc failed:" and lines[1] == "k.cu:100: error: e0"
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "... and 15 more"
    assert max(len(line) for line in lines) <= toolchain_diagnostics.MAX_MESSAGE_CHARS


def test_compile_error_without_parsed_diagnostics_shows_the_log_tail():
    text = str(CompileError("nvcc failed:", [], log="\n".join(f"line {i}" for i in range(100))))
    assert "line 99" in text and "line 10\n" not in text


# --------------------------------------------------------------------------- the CLI


GELU_KERNEL = """\
#include <cuda_runtime.h>
#include "gelu_tanh_abi.h"
__global__ void gelu(const float* x, float* y, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) { float v = x[i]; y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))); }
}
extern "C" cudaError_t gelu_tanh_forward(const gelu_tanh_args* a, cudaStream_t stream) {
  long n = a->N * a->D;
  gelu<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((const float*)a->x.data, (float*)a->out.data, n);
  return cudaGetLastError();
}
extern "C" cudaError_t gelu_tanh_backward(const gelu_tanh_bwd_args* a, cudaStream_t stream) {
  return cudaErrorNotSupported;
}
"""


@pytest.mark.nvcc
def test_cli_compile_against_the_spec_header(tmp_path, capsys):
    import json

    from specgen.cli import main

    spec = REPO / "specs" / "gelu_tanh.yaml"
    kernel = tmp_path / "gelu_tanh.cu"
    kernel.write_text(GELU_KERNEL)
    out = tmp_path / "result.json"
    assert main(["compile", str(spec), "--kernel", str(kernel), "--arch", "sm_90", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["ok"] and not result["cached"] and Path(result["library"]).is_file()
    assert "gelu(float const*, float*, long)" in result["resources"]
    assert "cache miss" in capsys.readouterr().out

    kernel.write_text(GELU_KERNEL.replace("a->N * a->D", "a->N * a->Q"))
    assert main(["compile", str(spec), "--kernel", str(kernel), "--arch", "sm_90"]) == EXIT_REJECTED
    assert f"{kernel}:8: error:" in capsys.readouterr().err


def test_cli_compile_without_toolkit_exits_3(tmp_path, monkeypatch, capsys):
    from specgen.cli import main

    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    kernel = tmp_path / "k.cu"
    kernel.write_text(GELU_KERNEL)
    assert main(["compile", str(REPO / "specs" / "gelu_tanh.yaml"), "--kernel", str(kernel)]) == EXIT_ENVIRONMENT
    assert "CUDA_HOME" in capsys.readouterr().err


@pytest.mark.nvcc
def test_defined_symbols_lists_the_entry_points_and_not_the_imports(tmp_path):
    from specgen.toolchain import defined_symbols

    kernel = compile_kernel(ADD_ONE, cache_dir=tmp_path)
    exported = defined_symbols(kernel.library)
    assert "run" in exported
    assert "cudaLaunchKernel" not in exported and "cudaGetLastError" not in exported
