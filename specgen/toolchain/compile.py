"""Compile a candidate `.cu` into a shared library against the shared CUDA runtime, cached by content."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import EnvironmentMissing, Rejected, UsageError
from .cuda import CudaToolkit, detect_gpu_arch, find_cuda_toolkit
from .diagnostics import Diagnostic, format_diagnostics, parse_diagnostics

NVCC_TIMEOUT_S = 300.0
CACHE_FORMAT = 1  # bump when the cache layout or the compile command changes meaning


class CompileError(Rejected):
    """nvcc rejected a candidate. `str()` is short and fit to show a user or an LLM."""

    def __init__(self, summary: str, diagnostics: list[Diagnostic], log: str):
        self.summary = summary
        self.diagnostics = diagnostics
        self.log = log
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return format_diagnostics(self.summary, self.diagnostics, self.log)


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
    # bytes of module-scope device memory (`__device__`, `__managed__` variables, `const` or not):
    # ptxas's `N bytes gmem`; None when the log did not say (see parse_module_memory)
    module_memory_bytes: int | None = None


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
    source_text, source_path = read_source(source)
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

    meta = _read_meta(library) if library.exists() else {}
    if "module_memory_bytes" in meta or "log" in meta:
        # A library whose build report is lost is built again: the verifier judges its module memory.
        module_memory = meta.get("module_memory_bytes", parse_module_memory(meta.get("log", "")))
        return CompiledKernel(library, source_hash, arch, True, time.perf_counter() - started,
                              [Diagnostic(**d) for d in meta.get("diagnostics", [])], meta.get("resources", {}),
                              key, meta.get("command", []), module_memory)

    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EnvironmentMissing(f"cannot create the kernel cache folder {cache}: {error}. "
                                 f"Set SPECGEN_CACHE_DIR to a writable folder.") from error
    includes = [f"-I{d}" for d, _ in header_roots]
    with tempfile.TemporaryDirectory(prefix="specgen-build-", ignore_cleanup_errors=True) as build_dir:
        (Path(build_dir) / build_name).write_text(source_text)
        partial = cache / f".{library.stem}.{os.getpid()}.{os.urandom(4).hex()}.tmp.so"
        command = [str(toolkit.nvcc), *flags, *includes, build_name, "-o", str(partial)]
        try:
            returncode, log = _run_with_timeout(command, cwd=build_dir, timeout=timeout, cleanup=[build_dir])
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
            module_memory = parse_module_memory(log)
            _write_meta(library, {"diagnostics": [asdict(d) for d in warnings], "resources": resources,
                                  "module_memory_bytes": module_memory, "command": command,
                                  "source_name": display_name, "log": log})
            os.replace(partial, library)  # atomic: other processes see no file or the whole file
        finally:
            partial.unlink(missing_ok=True)
    return CompiledKernel(library, source_hash, arch, False, time.perf_counter() - started, warnings, resources,
                          key, command, module_memory)


def read_source(source: Path | str) -> tuple[str, Path | None]:
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


def _run_with_timeout(command: list[str], cwd: str, timeout: float,
                      cleanup: Sequence[str] = ()) -> tuple[int | None, str]:
    """Run nvcc in its own process group under a guard (specgen.procguard): a timeout or an
    interrupt stops cicc/ptxas too, and so does specgen's own death. returncode None on timeout."""
    from ..procguard import run_guarded

    return run_guarded(command, cwd=cwd, timeout=timeout, cleanup=cleanup)


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


# `ptxas info    : 262144 bytes gmem` (older ptxas: `..., 64 bytes cmem[3]` after it), one line per
# ptxas run: the module's `__device__`/`__managed__` variables, initialized or not, `const` or not.
# A candidate can put such a line in the log itself (`#pragma message("\nptxas info : 0 bytes gmem")`
# prints one), never take ptxas's away: the largest line counts.
_PTXAS_GMEM = re.compile(r"^ptxas info\s*: (\d+) bytes gmem\b", re.MULTILINE)


def parse_module_memory(log: str) -> int | None:
    """Bytes of module-scope device memory `ptxas -v` reported: the largest of its runs (one per
    target architecture of the one translation unit), or None when no line says."""
    sizes = [int(size) for size in _PTXAS_GMEM.findall(log)]
    return max(sizes) if sizes else None


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


