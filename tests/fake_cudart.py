"""A stand-in CUDA runtime in C for the pending-error and refused-setup tests (gcc, no GPU).

Its last error is per host thread (`__thread`), as the real runtime's; cudaDeviceSetLimit records
the limit and value it was given and refuses a limit no device has (cudaErrorUnsupportedLimit,
recorded as the thread's last error). Test hooks: fake_leave(code) records an error without failing
a call (as a refused setup call whose error nobody read), fake_sticky(code) makes an error that
cudaGetLastError cannot clear (no driver, a lost context). Built with the real runtime's soname and
symbol version, so a program linked against it binds as a kernel binds to libcudart.so.13.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = r"""
#include <stddef.h>
static __thread int last_error;
static int sticky;
static int last_limit = -1;
static size_t last_value;
int cudaPeekAtLastError(void) { return sticky ? sticky : last_error; }
int cudaGetLastError(void) { int e = sticky ? sticky : last_error; last_error = 0; return e; }
const char* cudaGetErrorName(int e) {
  switch (e) {
    case 0: return "cudaSuccess";
    case 35: return "cudaErrorInsufficientDriver";
    case 215: return "cudaErrorUnsupportedLimit";
    case 700: return "cudaErrorIllegalAddress";
    case 801: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}
int cudaDeviceSetLimit(int limit, size_t value) {
  last_limit = limit;
  last_value = value;
  if (limit < 0 || limit > 10) { last_error = 215; return 215; }
  return 0;
}
void fake_leave(int code) { last_error = code; }
void fake_sticky(int code) { sticky = code; }
int fake_last_limit(void) { return last_limit; }
size_t fake_last_value(void) { return last_value; }
"""

SONAME = "libcudart.so.13"


def c_compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc, gcc, clang)")
    return cc


def build_fake_runtime(folder: Path, soname: str = SONAME) -> Path:
    """The fake runtime as `folder/<soname>`, its symbols versioned `soname` (libcudart.so.13: as the
    real runtime's). In a process where torch loaded the real libcudart.so.13, load one under
    another soname (ctypes by path), so no lookup by soname can mistake one for the other."""
    cc = c_compiler()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fake_cudart.c").write_text(SOURCE)
    (folder / "fake_cudart.map").write_text(f"{soname} {{ global: *; }};\n")
    library = folder / soname
    subprocess.run([cc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}",
                    f"-Wl,--version-script={folder / 'fake_cudart.map'}", "-o", str(library),
                    str(folder / "fake_cudart.c")], check=True, capture_output=True)
    return library


def build_program(folder: Path, source: str, runtime_dir: Path, name: str = "program") -> Path:
    """A host program linked against the libcudart.so.13 in `runtime_dir` (fake or real)."""
    cc = c_compiler()
    (folder / f"{name}.c").write_text(source)
    program = folder / name
    subprocess.run([cc, "-O1", "-o", str(program), str(folder / f"{name}.c"), f"-L{runtime_dir}",
                    f"-l:{SONAME}", f"-Wl,-rpath,{runtime_dir}", "-ldl"], check=True, capture_output=True)
    return program
