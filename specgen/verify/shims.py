"""LD_PRELOAD shims for a candidate's process, built here with the system's C compiler.

A kernel's library is built with `-cudart shared` (toolchain/compile.py), so every CUDA runtime call
its host code makes is an undefined dynamic symbol of libcudart: a shim preloaded into one process
of the candidate's interposes on the calls it names and forwards them to the real runtime. Two
checks use one: refused_setup.py (a persisting-L2 set-aside refused, as under MPS) and
slow_runtime.py (runtime calls made slow, so races between host threads are met). Each shim is
built once per source, flags and compiler (cached by content, written atomically).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SHIM_FLAGS = ("-shared", "-fPIC", "-O2", "-std=gnu11")


def c_compiler() -> str | None:
    """The system's C compiler ($CC, cc, gcc, clang), or None."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and (found := shutil.which(name)):
            return found
    return None


def cudart_soname(library) -> str | None:
    """The CUDA runtime the library links (its DT_NEEDED libcudart), e.g. libcudart.so.13."""
    from ..toolchain.symbols import needed_libraries

    return next((name for name in needed_libraries(Path(library)) if name.startswith("libcudart.so")), None)


def build_shim(source: Path, kind: str, defines: dict[str, str], cache_dir: Path | None = None
               ) -> tuple[Path | None, str | None]:
    """(the shim `source` built with `defines` as -D flags, None) or (None, why it could not be
    built). Cached under `kind` by content (source, flags, compiler)."""
    from ..toolchain.compile import default_cache_dir

    compiler = c_compiler()
    if compiler is None:
        return None, f"no C compiler (cc, gcc or clang) to build the {kind} shim"
    text = Path(source).read_text()
    flags = [*SHIM_FLAGS, *(f"-D{name}={value}" for name, value in sorted(defines.items()))]
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    key = hashlib.sha256(json.dumps({"source": text, "flags": flags, "compiler": [compiler, version]},
                                    sort_keys=True).encode()).hexdigest()[:24]
    folder = Path(cache_dir or default_cache_dir()) / kind
    target = folder / f"{kind.replace('-', '_')}_{key}.so"
    if target.is_file():
        return target, None
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        partial = Path(scratch) / target.name
        command = [compiler, *flags, "-o", str(partial), str(source), "-ldl"]
        try:
            built = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as error:
            return None, f"the {kind} shim did not build ({error})"
        if built.returncode != 0:
            tail = (built.stderr or built.stdout).strip().splitlines()[-3:]
            return None, f"the {kind} shim did not build ({compiler}: {' '.join(tail)})"
        os.replace(partial, target)  # atomic: a verification beside this one sees a whole file or none
    return target, None


def preload_env(shim: Path, environ: dict | None = None) -> dict[str, str]:
    """The environment entries that preload `shim` ahead of what the environment preloads already."""
    existing = (os.environ if environ is None else environ).get("LD_PRELOAD", "")
    return {"LD_PRELOAD": ":".join(p for p in (str(shim), existing) if p)}


def preloaded_process(spec, library, shim: Path, situation: str, where: str, progress):
    """The candidate's process started with `shim` preloaded and `library` loaded: the runner.
    `situation` for the progress line ("the CUDA runtime slowed"), `where` for a load failure's
    detail (a crash, as any process's load)."""
    from .isolation import IsolatedRunner
    from .verdict import CRASH, Failure

    runner = IsolatedRunner(spec, extra_env=preload_env(shim))
    runner.wait_ready(heartbeat=lambda seconds: progress(
        f"starting the kernel's process with {situation} ({seconds:.0f} s)"))
    outcome = runner.load(library)
    if outcome.fatal:
        runner.close()
        raise Failure(CRASH, f"loading the kernel library {where}: {outcome.fatal}", fatal=True)
    return runner
