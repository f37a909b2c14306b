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

# What a kernel may never call, by family. A kernel computes on the GPU through the CUDA
# runtime; it has no business with files, processes, the network, the environment, signals,
# memory mappings, loading code, or memory kept from one call to the next. Names are matched
# after removing glibc's decorations (`__open_2`, `__read_chk`, `open64`, `__xstat64`,
# `__isoc99_scanf`): see _base_names.
_REFUSED_FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    "dynamic loading": ("loads code at run time (dlopen/dlsym and friends are refused in a kernel)", frozenset("""
        dlopen dlmopen dlsym dlvsym dladdr dladdr1 dlinfo dlerror dlclose dl_iterate_phdr libc_dlopen_mode
        libc_dlsym libc_dlclose""".split())),
    "processes": ("starts, signals or controls a process (refused in a kernel)", frozenset("""
        system popen pclose fork vfork Fork clone clone3 execv execve execvp execvpe execl execle execlp
        fexecve execveat posix_spawn posix_spawnp kill killpg tgkill tkill raise sigqueue pthread_kill
        pthread_sigqueue ptrace syscall prctl arch_prctl daemon setsid setpgid setpgrp wait waitpid wait3 wait4
        waitid pidfd_open pidfd_send_signal pidfd_getfd process_vm_readv process_vm_writev unshare setns
        personality setuid setgid seteuid setegid setreuid setregid setresuid setresgid setgroups setfsuid
        setfsgid setrlimit prlimit chroot pivot_root mount umount umount2 reboot init_module finit_module
        delete_module bpf perf_event_open seccomp pthread_create thrd_create""".split())),
    "files": ("opens, reads, writes or changes files and folders (refused in a kernel)", frozenset("""
        open openat openat2 creat fopen freopen fdopen fmemopen open_memstream tmpfile tmpnam tempnam mkstemp
        mkstemps mkostemp mkostemps mkdtemp mktemp read pread readv preadv preadv2 write pwrite writev pwritev
        pwritev2 fread fgets fgetc getc getchar gets getline getdelim scanf fscanf vscanf vfscanf getw lseek
        llseek ftruncate truncate fsync fdatasync sync syncfs sendfile splice tee vmsplice copy_file_range
        fallocate posix_fallocate fcntl ioctl flock lockf close close_range closefrom dup dup2 dup3 pipe pipe2
        mkfifo mkfifoat mknod mknodat memfd_create unlink unlinkat remove rename renameat renameat2 mkdir
        mkdirat rmdir link linkat symlink symlinkat readlink readlinkat chmod fchmod fchmodat chown fchown lchown
        fchownat utime utimes utimensat futimens futimes lutimes access faccessat faccessat2 euidaccess eaccess
        chdir fchdir getcwd getwd get_current_dir_name realpath canonicalize_file_name opendir fdopendir
        readdir readdir_r scandir scandirat glob nftw ftw fts_open fts_read stat fstat lstat fstatat
        newfstatat statx xstat fxstat lxstat fxstatat statfs fstatfs statvfs fstatvfs setxattr lsetxattr
        fsetxattr getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr removexattr lremovexattr
        fremovexattr inotify_init inotify_init1 inotify_add_watch fanotify_init fanotify_mark shm_open
        shm_unlink sem_open sem_unlink mq_open mq_unlink shmget shmat shmctl msgget semget""".split())),
    "network": ("uses the network (refused in a kernel)", frozenset("""
        socket socketpair connect bind listen accept accept4 send sendto sendmsg sendmmsg recv recvfrom recvmsg
        recvmmsg shutdown getsockopt setsockopt getpeername getsockname getaddrinfo getnameinfo gethostbyname
        gethostbyname2 gethostbyname_r gethostbyname2_r gethostbyaddr gethostbyaddr_r res_query res_search
        res_init res_nquery res_nsearch res_ninit""".split())),
    "environment": ("reads or changes the process environment (refused in a kernel)", frozenset("""
        getenv secure_getenv setenv unsetenv putenv clearenv environ _environ program_invocation_name
        program_invocation_short_name progname progname_full getpwnam getpwuid getpwent getlogin getlogin_r
        stdin""".split())),
    "memory mapping": ("maps or re-protects memory (refused in a kernel)", frozenset("""
        mmap munmap mremap mprotect pkey_mprotect pkey_alloc remap_file_pages""".split())),
    "device state": ("asks how full the GPU is or how much its memory pools hold (refused in a kernel: what it "
                     "computes may not depend on the state of the device)", frozenset("""
        cudaMemGetInfo cudaMemPoolGetAttribute cudaMemPoolExportPointer cudaDeviceGetLimit
        cudaDeviceGetP2PAttribute""".split())),
    "signals": ("installs signal handlers or timers (refused in a kernel)", frozenset("""
        signal sigaction sigset bsd_signal sysv_signal ssignal alarm ualarm setitimer timer_create
        signalfd""".split())),
    # Memory a call keeps past its return, outside the workspace the ABI hands it: a table or scratch
    # cached by the first call (held-out attacks-v6's gelu cached a table in cudaMalloc'd memory, kept
    # per process, not per device) is shared by calls side by side, other devices and graph replays,
    # and cudaMalloc/cudaFree synchronize and cannot be captured. cudaMallocAsync/cudaFreeAsync on
    # `stream` stay allowed: kernels written before the workspace allocate per call with them.
    "memory kept past a call": ("allocates or frees device, managed or pinned host memory, which outlives the call "
                                "(refused in a kernel: memory kept outside the workspace is shared by calls on "
                                "other streams, other devices and graph replays, and cudaMalloc/cudaFree "
                                "synchronize the device and break CUDA graph capture; use the workspace the ABI "
                                "hands the call, and put constant tables in __constant__ memory)", frozenset("""
        cudaMalloc cudaMallocManaged cudaMallocPitch cudaMalloc3D cudaMallocArray cudaMalloc3DArray
        cudaMallocMipmappedArray cudaMallocHost cudaHostAlloc cudaHostRegister cudaHostUnregister cudaFree
        cudaFreeHost cudaFreeArray cudaFreeMipmappedArray""".split())),
}
_REFUSED = {name: family for family, (_, names) in _REFUSED_FAMILIES.items() for name in names}
# Names a kernel library must not define: it would interpose on the C library or the CUDA
# runtime in every process that loads it with global symbol binding.
_LIBC_CORE = frozenset("""
    malloc calloc realloc free aligned_alloc posix_memalign memalign valloc memcpy memmove memset memcmp strlen
    strcpy strncpy strcmp printf fprintf puts fputs fwrite exit abort atexit""".split())


def _base_names(name: str) -> list[str]:
    """The name and its undecorated forms: `__open_2` -> open, `__xstat64` -> xstat, `__isoc99_fscanf` -> fscanf."""
    forms = [name]
    base = re.sub(r"^(__isoc\d\d_|__libc_|__GI_)", "", name).lstrip("_")
    forms.append(base)
    for suffix in ("_chk", "_2", "_unlocked", "64", "_time64"):
        if base.endswith(suffix) and len(base) > len(suffix):
            base = base[:-len(suffix)]
            forms.append(base)
    return forms


def refused_family(name: str) -> str | None:
    """The family of refused calls `name` belongs to, or None."""
    for form in _base_names(name):
        if form in _REFUSED:
            return _REFUSED[form]
        if form.startswith("posix_spawn"):
            return "processes"
    return None


# The CUDA runtime calls a kernel needs no more than a model needs them mid-op: streams and
# events of its own, waits and synchronizations, graph-capture queries, host callbacks, and the
# driver's entry points. With them a kernel can fork work off `stream` and never join it (the
# caller's next op reads unfinished outputs; a timer on `stream` misses the work), behave
# differently while captured, or stall the host (the synchronous copies and memsets run on the
# legacy stream and block). A call is one launch sequence on `stream`.
_STREAM_CALLS = frozenset("""
    cudaStreamCreate cudaStreamCreateWithFlags cudaStreamCreateWithPriority cudaStreamDestroy cudaStreamWaitEvent
    cudaStreamSynchronize cudaStreamQuery cudaStreamIsCapturing cudaStreamGetCaptureInfo
    cudaStreamGetCaptureInfo_v2 cudaStreamGetCaptureInfo_v3 cudaStreamUpdateCaptureDependencies
    cudaStreamUpdateCaptureDependencies_v2 cudaStreamBeginCapture cudaStreamBeginCaptureToGraph
    cudaStreamEndCapture cudaThreadExchangeStreamCaptureMode cudaStreamAddCallback cudaLaunchHostFunc
    cudaStreamAttachMemAsync cudaStreamCopyAttributes cudaStreamSetAttribute cudaEventCreate
    cudaEventCreateWithFlags cudaEventRecord cudaEventRecordWithFlags cudaEventSynchronize cudaEventQuery
    cudaEventElapsedTime cudaEventElapsedTime_v2 cudaEventDestroy cudaDeviceSynchronize cudaThreadSynchronize
    cudaGetDriverEntryPoint cudaGetDriverEntryPointByVersion cudaSetDevice cudaDeviceReset cudaIpcOpenMemHandle
    cudaIpcGetMemHandle cudaIpcOpenEventHandle cudaMemcpy cudaMemcpy2D cudaMemcpy3D cudaMemcpyPeer cudaMemcpyToSymbol
    cudaMemcpyFromSymbol cudaMemcpy2DToArray cudaMemcpy2DFromArray cudaMemcpyToArray cudaMemcpyFromArray cudaMemset
    cudaMemset2D cudaMemset3D""".split())


def stream_calls(library: Path) -> list[str]:
    """The library's calls of CUDA runtime functions that leave the given stream (one line each;
    [] = none): its own streams and events, waits, synchronizations, capture queries, callbacks."""
    found = sorted({s.name for s in undefined_dynamic_symbols(library)
                    if s.name in _STREAM_CALLS or s.name.startswith(("cudaGraph", "cudaUserObject"))})
    return [f"{name}: works outside the given `stream` (its own streams, events, waits or graphs, a "
            f"synchronization, a synchronous copy, a capture query or a host callback)" for name in found]


def check_symbols(library: Path, allowed_libraries: Sequence[str] = ()) -> list[str]:
    """Why the library is refused, one line per offending symbol or DT_NEEDED entry ([] = clean).

    A candidate may call the CUDA runtime and the C/C++ runtime only; the libraries in
    `allowed_libraries` (the spec's `libraries:`) too. Even there it may never touch files,
    processes, the network or the environment, install signal handlers, map memory or load
    code (the families above); it may not interpose on the C library or the CUDA runtime, run
    code when it is loaded (static constructors) nor make system calls itself.
    """
    from .loadcode import load_time_code, raw_system_calls

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
    for name in sorted(defined_symbols(library)):
        if refused_family(name) or name in _LIBC_CORE or _CUDA_RUNTIME_SYMBOLS.match(name):
            violations.append(f"{name}: the library defines a C library or CUDA runtime function, which would "
                              f"replace the real one in the process that loads it (refused in a kernel)")
    violations += load_time_code(library)
    violations += raw_system_calls(library)
    return violations


def _symbol_refusal(symbol: DynamicSymbol, allowed: set[str]) -> str | None:
    name = symbol.name
    if family := refused_family(name):
        return _REFUSED_FAMILIES[family][0]
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
