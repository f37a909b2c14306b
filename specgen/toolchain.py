"""The CUDA toolchain: find the toolkit, compile a candidate `.cu` into a cached shared
library, turn nvcc's output into short diagnostics, and read the library's symbols.

A candidate is built against the *shared* CUDA runtime (`-cudart shared`) so that its
undefined dynamic symbols say exactly what it calls; `check_symbols` refuses anything
beyond the CUDA runtime and the C/C++ runtime (DESIGN.md, "Verification").
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import EnvironmentMissing, Rejected, UsageError

NVCC_TIMEOUT_S = 300.0
DEFAULT_CUDA_ROOT = Path("/usr/local/cuda")
CACHE_FORMAT = 1  # bump when the cache layout or the compile command changes meaning
MAX_SHOWN_DIAGNOSTICS = 20
MAX_MESSAGE_CHARS = 300

# --------------------------------------------------------------------------- the toolkit


@dataclass(frozen=True)
class CudaToolkit:
    root: Path  # symlinks resolved
    nvcc: Path  # the real nvcc inside root, never a wrapper script
    include_dir: Path  # holds cuda_runtime.h
    cudart: Path  # libcudart.so (what `-cudart shared` links against)
    version: str  # "13.0"
    release: str = ""  # "13.0.88": part of the cache key


def find_cuda_toolkit() -> CudaToolkit:
    """Find a usable CUDA toolkit, looking in this order:

    1. ``$CUDA_HOME``, 2. ``$CUDA_PATH`` -- if set, it must be usable: a variable the user
       set that points at a broken toolkit is an error, not something to silently skip;
    3. ``/usr/local/cuda``, 4. ``nvcc`` on ``PATH`` (asked for its own root, since it may be
       a wrapper script or a symlink).

    Cached per process (keyed on the variables above, so changing them is seen).
    """
    env = os.environ
    return _find_cuda_toolkit(env.get("CUDA_HOME", ""), env.get("CUDA_PATH", ""), env.get("PATH", ""),
                              DEFAULT_CUDA_ROOT)


@functools.lru_cache(maxsize=8)
def _find_cuda_toolkit(cuda_home: str, cuda_path: str, path_env: str, default_root: Path) -> CudaToolkit:
    for variable, value in (("CUDA_HOME", cuda_home), ("CUDA_PATH", cuda_path)):
        if value:
            toolkit, missing = _inspect_root(Path(value))
            if toolkit:
                return toolkit
            raise EnvironmentMissing(
                f"${variable}={value} is not a usable CUDA toolkit: {'; '.join(missing)}. "
                f"Set {variable} to the toolkit root (the folder holding bin/nvcc, include/cuda_runtime.h "
                f"and lib64/libcudart.so, e.g. /usr/local/cuda-13.0), or unset it to search "
                f"/usr/local/cuda and the nvcc on PATH.")
    looked: list[str] = []
    if default_root.exists():
        toolkit, missing = _inspect_root(default_root)
        if toolkit:
            return toolkit
        looked.append(f"{default_root}: {'; '.join(missing)}")
    else:
        looked.append(f"{default_root}: does not exist")
    nvcc_on_path = shutil.which("nvcc", path=path_env or None)
    if nvcc_on_path:
        root = _ask_nvcc_for_root(Path(nvcc_on_path))
        if root is None:
            looked.append(f"nvcc on PATH ({nvcc_on_path}): did not report its install root")
        else:
            toolkit, missing = _inspect_root(root)
            if toolkit:
                return toolkit
            looked.append(f"nvcc on PATH ({nvcc_on_path}, root {root}): {'; '.join(missing)}")
    else:
        looked.append("PATH: no nvcc")
    raise EnvironmentMissing(
        "no usable CUDA toolkit found. Looked at $CUDA_HOME and $CUDA_PATH (unset), "
        + ", ".join(looked)
        + ". Install the CUDA toolkit (nvcc, headers and libcudart) and set CUDA_HOME to its root, "
          "e.g. export CUDA_HOME=/usr/local/cuda-13.0.")


def _inspect_root(root: Path) -> tuple[CudaToolkit | None, list[str]]:
    """A toolkit rooted at `root`, or the list of what is missing there."""
    if not root.is_dir():
        return None, [f"{root} is not a folder"]
    root = root.resolve()
    missing = []
    nvcc = root / "bin" / "nvcc"
    if not (nvcc.is_file() and os.access(nvcc, os.X_OK)):
        missing.append(f"no executable {nvcc}")
    target_dirs = sorted((root / "targets").glob("*-linux")) if (root / "targets").is_dir() else []
    include_dir = _first_existing([root / "include", *(t / "include" for t in target_dirs)], "cuda_runtime.h")
    if include_dir is None:
        missing.append(f"no cuda_runtime.h in {root / 'include'} or targets/*-linux/include")
    lib_dir = _first_existing([root / "lib64", root / "lib", *(t / "lib" for t in target_dirs)], "libcudart.so")
    if lib_dir is None:
        missing.append(f"no libcudart.so in {root}/lib64, lib or targets/*-linux/lib")
    if missing:
        return None, missing
    version, release = _nvcc_version(nvcc)
    if version is None:
        return None, [f"{nvcc} --version did not run or did not print a release ({release})"]
    return CudaToolkit(root=root, nvcc=nvcc, include_dir=include_dir, cudart=lib_dir / "libcudart.so",
                       version=version, release=release), []


def _first_existing(folders: list[Path], filename: str) -> Path | None:
    return next((folder for folder in folders if (folder / filename).exists()), None)


def _nvcc_version(nvcc: Path) -> tuple[str | None, str]:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return None, str(error)
    match = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", out)
    if not match:
        return None, out.strip()[-200:]
    return match.group(1), match.group(2)


def _ask_nvcc_for_root(nvcc: Path) -> Path | None:
    """The toolkit root as nvcc itself reports it (`TOP`, else `_HERE_/..`), symlinks resolved."""
    try:
        # --dryrun prints nvcc's settings without compiling; the input need not exist.
        result = subprocess.run([str(nvcc), "-v", "--dryrun", "specgen_probe.cu"], capture_output=True,
                                text=True, timeout=60, cwd=tempfile.gettempdir())
    except (OSError, subprocess.SubprocessError):
        return None
    settings = dict(re.findall(r"^#\$ (\w+)=(.*)$", result.stdout + result.stderr, flags=re.MULTILINE))
    if settings.get("TOP"):
        return Path(settings["TOP"]).resolve()
    if settings.get("_HERE_"):
        return Path(settings["_HERE_"]).resolve().parent
    return None


@functools.lru_cache(maxsize=1)
def detect_gpu_arch() -> str | None:
    """"sm_90" for the first visible GPU, None without one. Cached per process.

    Asks torch when it is already imported; else nvidia-smi; else the toolkit's own
    `__nvcc_device_query` (what `nvcc -arch=native` uses); torch is imported only when
    neither tool exists, since the import alone costs seconds. CUDA_VISIBLE_DEVICES is respected.
    """
    if "torch" not in sys.modules:
        if shutil.which("nvidia-smi"):
            return _arch_from_nvidia_smi()
        query = _device_query_tool()
        if query is not None:
            return _arch_from_device_query(query)
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


def _device_query_tool() -> Path | None:
    try:
        tool = find_cuda_toolkit().root / "bin" / "__nvcc_device_query"
    except EnvironmentMissing:
        return None
    return tool if tool.is_file() else None


def _arch_from_device_query(tool: Path) -> str | None:
    """`__nvcc_device_query` prints the visible GPUs' compute capabilities ("90" or "90,90"); fails without a driver."""
    try:
        out = subprocess.run([str(tool)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"\s*(\d{2,3})\b", out.stdout) if out.returncode == 0 else None
    return f"sm_{match.group(1)}" if match else None


def _arch_from_nvidia_smi() -> str | None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    command = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
    if visible is not None:
        first = visible.split(",")[0].strip()
        if not first or first.startswith("-"):
            return None  # CUDA_VISIBLE_DEVICES="" or "-1" hides every GPU
        command += ["-i", first]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"\s*(\d+)\.(\d+)", out.stdout) if out.returncode == 0 else None
    return f"sm_{match.group(1)}{match.group(2)}" if match else None


# --------------------------------------------------------------------------- diagnostics


@dataclass
class Diagnostic:
    line: int | None
    column: int | None
    severity: str  # "error" | "warning" | "note"
    message: str
    file: str | None
    source_line: str | None = None  # the offending source line, as nvcc echoed it

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line is not None else f"{self.file}: "
        return f"{where}{self.severity}: {self.message}"


# EDG front end (cudafe++): `kernel.cu(12): error #20: identifier "foo" is undefined`
_EDG = re.compile(r"^(?P<file>\S.*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|internal error|error|warning|"
                  r"remark)(?: #[\w-]+)?: (?P<msg>.*)$")
# gcc / clang (host code, the preprocessor): `kernel.cu:1:10: fatal error: x.h: No such file`
_GCC = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|warning|"
                  r"note): (?P<msg>.*)$")
# ptxas / nvlink / nvcc itself: `ptxas error   : Entry function '_Z3bigPf' uses too much shared data`
_TOOL = re.compile(r"^(?P<tool>ptxas|nvlink|nvcc|fatbinary)\s+(?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$")
_UNDEFINED_REFERENCE = re.compile(r"undefined reference to [`'](?P<symbol>[^'`]+)'")
_LINKER = re.compile(r"^(?:\S*/)?(?:ld|ld\.\w+|collect2)(?::| error:) (?P<msg>.*)$")
_SEVERITY = {"catastrophic error": "error", "internal error": "error", "fatal error": "error", "fatal": "error",
             "error": "error", "warning": "warning", "remark": "note", "note": "note"}


def parse_diagnostics(log: str) -> list[Diagnostic]:
    """Diagnostics from nvcc's combined output, in the order printed; duplicates dropped."""
    lines = log.splitlines()
    found: list[Diagnostic] = []
    for index, text in enumerate(lines):
        diagnostic = _parse_line(text, lines[index + 1:index + 4])
        if diagnostic and not any(_same(diagnostic, seen) for seen in found):
            found.append(diagnostic)
    return found


def _same(a: Diagnostic, b: Diagnostic) -> bool:
    return (a.file, a.line, a.severity, a.message) == (b.file, b.line, b.severity, b.message)


def _parse_line(text: str, following: list[str]) -> Diagnostic | None:
    if match := _EDG.match(text):
        source_line, column = _edg_context(following)
        return Diagnostic(int(match["line"]), column, _SEVERITY[match["sev"]], match["msg"].strip(),
                          match["file"], source_line)
    if match := _GCC.match(text):
        column = int(match["col"]) if match["col"] else None
        source_line = None
        if following and (gcc_echo := re.match(r"^\s*\d+\s\|\s?(.*)$", following[0])):
            source_line = gcc_echo.group(1).rstrip()
        return Diagnostic(int(match["line"]), column, _SEVERITY[match["sev"]], match["msg"].strip(),
                          match["file"], source_line)
    if match := _TOOL.match(text):
        return Diagnostic(None, None, _SEVERITY[match["sev"]], f"{match['tool']}: {match['msg'].strip()}", None)
    if match := _UNDEFINED_REFERENCE.search(text):
        return Diagnostic(None, None, "error", f"undefined reference to `{match['symbol']}' (link error)", None)
    if (match := _LINKER.match(text)) and not re.search(r"in function|ld returned", match["msg"]):
        return Diagnostic(None, None, "error", f"linker: {match['msg'].strip()}", None)
    return None


def _edg_context(following: list[str]) -> tuple[str | None, int | None]:
    """EDG echoes the source line indented by two spaces, then a caret under the column."""
    if len(following) < 2 or not following[0].startswith("  "):
        return None, None
    caret = following[1]
    if caret.strip() != "^":
        return following[0][2:].rstrip() or None, None
    return following[0][2:].rstrip() or None, caret.index("^") - 2 + 1


# --------------------------------------------------------------------------- compiling


class CompileError(Rejected):
    """nvcc rejected a candidate. `str()` is short and fit to show a user or an LLM."""

    def __init__(self, summary: str, diagnostics: list[Diagnostic], log: str):
        self.summary = summary
        self.diagnostics = diagnostics
        self.log = log
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return format_diagnostics(self.summary, self.diagnostics, self.log)


def format_diagnostics(summary: str, diagnostics: list[Diagnostic], log: str = "") -> str:
    """A summary line, then the first errors (then warnings), each trimmed; the log tail if none parsed."""
    errors = [d for d in diagnostics if d.severity == "error"]
    shown = (errors + [d for d in diagnostics if d.severity != "error"])[:MAX_SHOWN_DIAGNOSTICS]
    lines = [summary]
    for diagnostic in shown:
        lines.append(_trim(str(diagnostic)))
        if diagnostic.severity == "error" and diagnostic.source_line:
            lines.append("    " + _trim(diagnostic.source_line.strip()))
    if len(diagnostics) > len(shown):
        lines.append(f"... and {len(diagnostics) - len(shown)} more")
    if not diagnostics and log.strip():
        lines += [_trim(line) for line in log.strip().splitlines()[-MAX_SHOWN_DIAGNOSTICS:]]
    return "\n".join(lines)


def _trim(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 3] + "..."


@dataclass
class CompiledKernel:
    library: Path
    source_hash: str  # sha256 of the .cu text alone (the lock's kernel hash)
    arch: str
    cached: bool
    seconds: float  # wall time of this call (the compile, or the cache lookup)
    diagnostics: list[Diagnostic] = field(default_factory=list)  # warnings of the compile that made it
    resources: dict = field(default_factory=dict)  # kernel -> registers, shared/stack/spill bytes
    cache_key: str = ""
    command: list[str] = field(default_factory=list)


def default_cache_dir() -> Path:
    if os.environ.get("SPECGEN_CACHE_DIR"):
        return Path(os.environ["SPECGEN_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "specgen" / "kernels"


def compile_kernel(source: Path | str, *, include_dirs: Sequence[Path] = (), arch: str | None = None,
                   extra_flags: Sequence[str] = (), cache_dir: Path | None = None, name: str = "kernel",
                   source_name: str | None = None, timeout: float = NVCC_TIMEOUT_S) -> CompiledKernel:
    """Compile one `.cu` (a path, or the text itself) into a shared library, cached by content.

    A path's own folder is searched first for `#include "..."`, as nvcc would. Diagnostics
    name the file as `source_name` (default: the path as given, or `<name>.cu`).
    """
    started = time.perf_counter()
    toolkit = find_cuda_toolkit()
    source_text, source_path = _read_source(source)
    display_name = source_name or (str(source) if source_path else f"{name}.cu")
    build_name = Path(display_name).name if display_name.endswith(".cu") else Path(display_name).name + ".cu"
    arch = arch or detect_gpu_arch() or "sm_90"
    search_dirs = [Path(d) for d in include_dirs]
    header_roots = ([(source_path.parent, False)] if source_path else []) + [(d, True) for d in search_dirs]
    flags = _nvcc_flags(arch, toolkit) + list(extra_flags)
    key = _cache_key(source_text, header_roots, flags, arch, toolkit)
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "kernel"
    library = cache / f"{safe_name}-{key[:24]}.so"
    source_hash = hashlib.sha256(source_text.encode()).hexdigest()

    if library.exists():
        meta = _read_meta(library)
        return CompiledKernel(library, source_hash, arch, True, time.perf_counter() - started,
                              [Diagnostic(**d) for d in meta.get("diagnostics", [])], meta.get("resources", {}),
                              key, meta.get("command", []))

    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EnvironmentMissing(f"cannot create the kernel cache folder {cache}: {error}. "
                                 f"Set SPECGEN_CACHE_DIR to a writable folder.") from error
    includes = [f"-I{d}" for d, _ in header_roots]
    with tempfile.TemporaryDirectory(prefix="specgen-build-") as build_dir:
        (Path(build_dir) / build_name).write_text(source_text)
        partial = cache / f".{library.stem}.{os.getpid()}.{os.urandom(4).hex()}.tmp.so"
        command = [str(toolkit.nvcc), *flags, *includes, build_name, "-o", str(partial)]
        try:
            returncode, log = _run_with_timeout(command, cwd=build_dir, timeout=timeout)
            source_names = {build_name: display_name, **{str(Path(build_dir) / build_name): display_name}}
            diagnostics = [_relabel(d, source_names, header_roots) for d in parse_diagnostics(log)]
            if returncode is None:
                raise CompileError(f"nvcc timed out after {timeout:.0f} s compiling {display_name} for {arch}",
                                   diagnostics, log)
            if returncode != 0 or not partial.exists():
                count = sum(d.severity == "error" for d in diagnostics)
                raise CompileError(f"nvcc failed to compile {display_name} for {arch} "
                                   f"({count} error{'s' if count != 1 else ''}):", diagnostics, log)
            warnings = [d for d in diagnostics if d.severity != "error"]
            resources = parse_resources(log)
            _write_meta(library, {"diagnostics": [asdict(d) for d in warnings], "resources": resources,
                                  "command": command, "source_name": display_name, "log": log})
            os.replace(partial, library)  # atomic: other processes see no file or the whole file
        finally:
            partial.unlink(missing_ok=True)
    return CompiledKernel(library, source_hash, arch, False, time.perf_counter() - started, warnings, resources,
                          key, command)


def _read_source(source: Path | str) -> tuple[str, Path | None]:
    # A str is a path when it names a file or looks like one; .cu text always has newlines.
    if isinstance(source, Path) or ("\n" not in source and (source.endswith(".cu") or os.path.isfile(source))):
        path = Path(source)
        try:
            return path.read_text(), path.resolve()
        except OSError as error:
            raise UsageError(f"cannot read kernel source {path}: {error.strerror or error}") from error
    return source, None


_ARCH = re.compile(r"^sm_(\d{2,3}[af]?)$")


def _nvcc_flags(arch: str, toolkit: CudaToolkit) -> list[str]:
    match = _ARCH.match(arch)
    if not match:
        raise UsageError(f"GPU architecture {arch!r} is not of the form sm_90 (or sm_90a, sm_100f): "
                         f"pass --arch sm_XX with the GPU's compute capability")
    virtual = f"compute_{match.group(1)}"
    return ["-O3", "-std=c++17", "--shared", "-Xcompiler", "-fPIC", "-cudart", "shared", "-lineinfo",
            "-Xptxas", "-v", "-gencode", f"arch={virtual},code=[{arch},{virtual}]",
            # so the library loads outside a process that already has libcudart (e.g. from ctypes)
            "-Xlinker", f"-rpath={toolkit.cudart.parent}"]


def _cache_key(source_text: str, header_roots: list[tuple[Path, bool]], flags: list[str], arch: str,
               toolkit: CudaToolkit) -> str:
    """sha256 over everything that changes the library. Include folders are hashed by content
    and relative name only, so a fresh temp folder holding the same header is a hit."""
    headers = []
    for position, (folder, recursive) in enumerate(header_roots):
        pattern_files = folder.rglob("*") if recursive else folder.glob("*")
        for path in sorted(p for p in pattern_files if p.suffix in (".h", ".cuh", ".hpp") and p.is_file()):
            headers.append([position, str(path.relative_to(folder)), hashlib.sha256(path.read_bytes()).hexdigest()])
    payload = {"format": CACHE_FORMAT, "source": source_text, "headers": headers, "flags": flags, "arch": arch,
               "nvcc": [str(toolkit.nvcc), toolkit.release]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _run_with_timeout(command: list[str], cwd: str, timeout: float) -> tuple[int | None, str]:
    """Run nvcc in its own process group so a timeout also stops cicc/ptxas; returncode None on timeout."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        out, _ = process.communicate(timeout=timeout)
        return process.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        return None, out


def _relabel(diagnostic: Diagnostic, source_names: dict[str, str],
             header_roots: list[tuple[Path, bool]]) -> Diagnostic:
    """Show the user's file name for the source, a header's name relative to its include folder."""
    file = diagnostic.file
    if file is None:
        return diagnostic
    if file in source_names:
        diagnostic.file = source_names[file]
    elif Path(file).name.startswith("tmpxft_"):
        diagnostic.file = None  # nvcc's intermediate file: its line numbers mean nothing to the user
        diagnostic.line = diagnostic.column = None
    else:
        for folder, _ in header_roots:
            try:
                diagnostic.file = str(Path(file).resolve().relative_to(folder.resolve()))
                break
            except ValueError:
                continue
    return diagnostic


# `ptxas info    : Compiling entry function '_Z7add_onePfi' for 'sm_90'`
_PTXAS_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '(?P<name>[^']+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"ptxas info\s*: Used (\d+) registers")


def parse_resources(log: str) -> dict:
    """Per kernel (demangled name): registers, shared/stack/spill bytes, from `ptxas -v`."""
    per_kernel: dict[str, dict] = {}
    current: dict | None = None
    for line in log.splitlines():
        if match := _PTXAS_ENTRY.search(line):
            current = per_kernel.setdefault(match["name"], {"mangled": match["name"], "registers": None,
                                                            "shared_bytes": 0, "stack_bytes": 0,
                                                            "spill_store_bytes": 0, "spill_load_bytes": 0})
        elif current is None:
            continue
        elif match := _PTXAS_FRAME.search(line):
            current["stack_bytes"], current["spill_store_bytes"], current["spill_load_bytes"] = map(
                int, match.groups())
        elif match := _PTXAS_USED.search(line):
            current["registers"] = int(match.group(1))
            if smem := re.search(r"(\d+) bytes smem", line):
                current["shared_bytes"] = int(smem.group(1))
            if barriers := re.search(r"used (\d+) barriers", line):
                current["barriers"] = int(barriers.group(1))
    names = _demangle(list(per_kernel))
    return {names.get(mangled, mangled): info for mangled, info in per_kernel.items()}


def _demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if not names or not tool:
        return {}
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    demangled = out.splitlines()
    return dict(zip(names, demangled)) if len(demangled) == len(names) else {}


def _meta_path(library: Path) -> Path:
    return library.with_suffix(".json")


def _write_meta(library: Path, meta: dict) -> None:
    target = _meta_path(library)
    partial = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    partial.write_text(json.dumps(meta, indent=1))
    os.replace(partial, target)


def _read_meta(library: Path) -> dict:
    try:
        return json.loads(_meta_path(library).read_text())
    except (OSError, ValueError):
        return {}  # the library is still good; only the report of its build is lost


# --------------------------------------------------------------------------- symbols


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
                     "execle", "execlp", "posix_spawn", "posix_spawnp"}


def check_symbols(library: Path, allowed_libraries: Sequence[str] = ()) -> list[str]:
    """Why the library is refused, one line per offending symbol or DT_NEEDED entry ([] = clean).

    A candidate may call the CUDA runtime and the C/C++ runtime only; the libraries in
    `allowed_libraries` (the spec's `libraries:`) too. It may never load code itself
    (dlopen/dlsym) nor start processes.
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
        return "starts a process (refused in a kernel)"
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
