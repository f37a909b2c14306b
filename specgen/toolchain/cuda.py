"""Find the CUDA toolkit (and check it is usable) and the visible GPU's architecture."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnvironmentMissing

NVCC_TIMEOUT_S = 300.0
DEFAULT_CUDA_ROOT = Path("/usr/local/cuda")


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


