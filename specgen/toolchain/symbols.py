"""Read a compiled library's dynamic symbols and refuse what a kernel may not call."""
from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnvironmentMissing, UsageError


@dataclass(frozen=True)
class DynamicSymbol:
    name: str
    version: str | None  # "GLIBC_2.2.5", "libcudart.so.13"; None when unversioned
    weak: bool


def _binutil(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise EnvironmentMissing(f"{tool} is not on PATH; it is needed to read a compiled kernel's symbols. "
                                 f"Install binutils (e.g. apt-get install binutils).")
    return path


def _readelf(library: Path, *options: str) -> str:
    result = subprocess.run([_binutil("readelf"), "-W", *options, str(library)], capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0:
        raise UsageError(f"cannot read {library} as an ELF shared library: {result.stderr.strip()}")
    return result.stdout


# `    10: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND cudaGetLastError@libcudart.so.13 (2)`
_DYNSYM = re.compile(r"^\s*\d+:\s+[0-9a-fA-F]+\s+\d+\s+\w+\s+(?P<bind>\w+)\s+\w+\s+UND\s+(?P<name>[^\s@]+)"
                     r"(?:@+(?P<version>[^\s(]+))?")


def undefined_dynamic_symbols(library: Path) -> list[DynamicSymbol]:
    symbols = []
    for line in _readelf(library, "--dyn-syms").splitlines():
        if match := _DYNSYM.match(line):
            symbols.append(DynamicSymbol(match["name"], match["version"], match["bind"] == "WEAK"))
    return symbols


# `    12: 0000000000001139    42 FUNC    GLOBAL DEFAULT   12 gelu_tanh_forward`
_DEFINED = re.compile(r"^\s*\d+:\s+[0-9a-fA-F]+\s+\d+\s+\w+\s+(?:GLOBAL|WEAK)\s+\w+\s+(?!UND\b)\S+\s+([^\s@]+)")


def defined_symbols(library: Path) -> set[str]:
    """Names the library exports (defined, global or weak): its entry points among them."""
    return {match[1] for line in _readelf(library, "--dyn-syms").splitlines() if (match := _DEFINED.match(line))}


def undefined_symbols(library: Path) -> list[str]:
    """The library's undefined dynamic symbols (names without their version), sorted."""
    return sorted({symbol.name for symbol in undefined_dynamic_symbols(library)})


def needed_libraries(library: Path) -> list[str]:
    """The library's DT_NEEDED entries, e.g. ["libcudart.so.13", "libc.so.6"]."""
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf(library, "-d"))


# The C/C++ runtime and the CUDA runtime: what every candidate may need.
_RUNTIME_LIBRARIES = re.compile(r"^(libcudart|libc|libm|libstdc\+\+|libgcc_s|libpthread|librt|libdl|ld-linux.*)"
                                r"\.so(\.[\d.]+)?$")
_RUNTIME_VERSIONS = re.compile(r"^(GLIBC_|GLIBCXX_|CXXABI_|GCC_|libcudart\.so)")
_CUDA_RUNTIME_SYMBOLS = re.compile(r"^(cuda|__cuda|__nv|__fatbinwrap)")
# Weak references every gcc-built shared library carries.
_TOOLCHAIN_WEAK = {"_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__gmon_start__", "__cxa_finalize"}
# Longest prefix first: cublasLt before cublas.
_LIBRARY_PREFIXES = [("cublasLt", "cublasLt"), ("cublas", "cublas"), ("cudnn", "cudnn"), ("cufft", "cufft"),
                     ("curand", "curand"), ("cusparse", "cusparse"), ("cusolver", "cusolver")]
_OTHER_LIBRARY_PREFIXES = ("nccl", "nvrtc", "nvJitLink", "cutensor", "npp", "nvjpeg", "cusparseLt", "nvshmem",
                           "_ZN2at", "_ZN3c10", "_ZN5torch", "Py")
_DYNAMIC_LOADING = {"dlopen", "dlmopen", "dlsym", "dlvsym", "dladdr", "dladdr1", "dlinfo", "dlerror",
                    "__libc_dlopen_mode", "__libc_dlsym"}
_PROCESS_SPAWNING = {"system", "popen", "fork", "vfork", "execv", "execve", "execvp", "execvpe", "execl",
                     "execle", "execlp", "posix_spawn", "posix_spawnp", "clone", "clone3", "kill", "raise",
                     "ptrace", "syscall", "prctl", "setsid", "daemon"}
# What a kernel has no business doing: files, the environment and the command line, the network,
# its own process image (a kernel that reads these can tell a benchmark from a verification).
_FILES = {"fopen", "fopen64", "freopen", "fdopen", "open", "open64", "openat", "openat64", "__open_2",
          "__open64_2", "creat", "creat64", "read", "pread", "pread64", "readv", "write", "pwrite", "writev",
          "fread", "fwrite", "fgets", "fscanf", "__isoc99_fscanf", "getline", "getdelim", "unlink", "unlinkat",
          "remove", "rename", "renameat", "mkdir", "rmdir", "opendir", "fdopendir", "readdir", "readdir64",
          "scandir", "stat", "stat64", "lstat", "fstat", "fstatat", "__xstat", "__fxstat", "__lxstat", "statx",
          "access", "faccessat", "readlink", "readlinkat", "chmod", "chown", "truncate", "ftruncate", "symlink",
          "link", "chdir", "getcwd", "realpath", "mkstemp", "tmpfile", "dup", "dup2", "pipe", "ioctl",
          "fcntl", "mmap", "mmap64", "mprotect", "munmap", "mremap", "shm_open", "memfd_create",
          "dl_iterate_phdr"}
_ENVIRONMENT = {"getenv", "secure_getenv", "__secure_getenv", "setenv", "unsetenv", "putenv", "clearenv",
                "environ", "__environ", "_environ", "program_invocation_name", "program_invocation_short_name",
                "__progname", "__progname_full", "__libc_argv", "__libc_argc", "getauxval", "sysconf_argv"}
_NETWORK = {"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "send", "sendto", "sendmsg",
            "recv", "recvfrom", "recvmsg", "getaddrinfo", "gethostbyname", "shutdown", "setsockopt", "getsockopt"}
_SIGNALS = {"signal", "sigaction", "__sysv_signal", "bsd_signal"}


def check_symbols(library: Path, allowed_libraries: Sequence[str] = ()) -> list[str]:
    """Why the library is refused, one line per offending symbol or DT_NEEDED entry ([] = clean).

    A candidate may call the CUDA runtime and the C/C++ runtime only; the libraries in
    `allowed_libraries` (the spec's `libraries:`) too. It may never load code itself
    (dlopen/dlsym), start or signal processes, make raw system calls, touch files or its own
    mappings, read the environment or the command line, or use the network.
    """
    allowed = set(allowed_libraries)
    violations = []
    for needed in needed_libraries(library):
        if _RUNTIME_LIBRARIES.match(needed):
            continue
        base = re.sub(r"\.so.*$", "", needed).removeprefix("lib")
        if base in allowed:
            continue
        hint = (f" (add `libraries: [{base}]` to the spec to allow it)" if base in dict(_LIBRARY_PREFIXES)
                else "")
        violations.append(f"{needed}: links a library other than the CUDA and C/C++ runtimes{hint}")
    for symbol in undefined_dynamic_symbols(library):
        reason = _symbol_refusal(symbol, allowed)
        if reason:
            shown = symbol.name + (f"@{symbol.version}" if symbol.version else "")
            violations.append(f"{shown}: {reason}")
    return violations


def _symbol_refusal(symbol: DynamicSymbol, allowed: set[str]) -> str | None:
    name = symbol.name
    if name in _DYNAMIC_LOADING:
        return "loads code at run time (dlopen/dlsym and friends are refused in a kernel)"
    if name in _PROCESS_SPAWNING:
        return "starts, signals or controls a process, or makes a raw system call (refused in a kernel)"
    if name in _FILES:
        return "touches files, descriptors or its own memory mappings (refused in a kernel)"
    if name in _ENVIRONMENT:
        return "reads the environment or the command line (refused in a kernel: it must compute the same " \
               "everywhere)"
    if name in _NETWORK:
        return "uses the network (refused in a kernel)"
    if name in _SIGNALS:
        return "installs a signal handler (refused in a kernel)"
    for prefix, library in _LIBRARY_PREFIXES:
        if name.startswith(prefix):
            if library in allowed:
                return None
            return (f"a {library} function; the spec's `libraries` does not allow {library} "
                    f"(add `libraries: [{library}]` to the spec, or compute it in the kernel)")
    if name.startswith(_OTHER_LIBRARY_PREFIXES):
        return "a function of a library a kernel may not call (only the CUDA and C/C++ runtimes)"
    if symbol.version and _RUNTIME_VERSIONS.match(symbol.version):
        return None
    if _CUDA_RUNTIME_SYMBOLS.match(name) or name in _TOOLCHAIN_WEAK:
        return None
    where = f"version {symbol.version}" if symbol.version else "unversioned"
    return (f"undefined symbol ({where}) not provided by the CUDA runtime or the C/C++ runtime; "
            f"a kernel must define everything else itself")
