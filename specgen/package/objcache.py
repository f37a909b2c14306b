"""A compiler launcher that caches the wheel build's object files by content, across builds.

`build_wheel` puts two small scripts first in the build's way: `PYTORCH_NVCC` (torch's
extension build runs nvcc through it) and `CXX` (the C++ compiler of the binding, and the
linker). Each calls this file by path (no specgen import: it runs once per compile):

    python objcache.py REAL_COMPILER ARGS...

A compile (`-c SRC -o OUT` with a dependency file) is looked up by a key over the compiler,
its arguments (the build tree's path replaced by a placeholder: every build uses a new
temporary tree) and the source's bytes; an entry holds, for each set of included headers
seen, their hashes, the object and the dependency file. When every header still hashes
the same, the object is copied out and the compiler never runs (ccache's "direct mode").
Anything else (linking, `-v`, a compile without a dependency file) runs the real compiler.

Environment: SPECGEN_TREE (the build tree), SPECGEN_OBJECT_CACHE (the cache folder);
without both the launcher only runs the compiler. SPECGEN_OBJECT_CACHE_SALT (build_wheel
sets it to the torch version and C++ ABI the binding compiles against) is part of every key:
an object built for one torch is never reused for another, even where its headers hash alike. SPECGEN_OBJECT_CACHE_LOG, when set, gets
one line per compile: "hit SRC" or "miss SRC".
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

PLACEHOLDER = "@SPECGEN_TREE@"
DEPFILE_FLAGS = ("-MF", "--dependency-output")


def _file_hash(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _after(args: list[str], flag: str) -> str | None:
    """The value of the last `flag VALUE` (torch's rule can repeat a flag: `$cflags -c $in`)."""
    for index in range(len(args) - 2, -1, -1):
        if args[index] == flag and not args[index + 1].startswith("-"):
            return args[index + 1]
    return None


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a make-style dependency file (targets and line joins dropped)."""
    words = text.replace("\\\n", " ").split()
    deps, seen_colon = [], False
    for word in words:
        if not seen_colon:
            if word.endswith(":"):
                seen_colon = True
            continue
        deps.append(word)
    return deps


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(temp, path)


def _log(line: str) -> None:
    target = os.environ.get("SPECGEN_OBJECT_CACHE_LOG")
    if target:
        with open(target, "a") as out:
            out.write(line + "\n")


def run(real: str, args: list[str]) -> int:
    tree, cache = os.environ.get("SPECGEN_TREE"), os.environ.get("SPECGEN_OBJECT_CACHE")
    source, output = _after(args, "-c"), _after(args, "-o")
    depfile = next((d for d in (_after(args, f) for f in DEPFILE_FLAGS) if d), None)
    if not (tree and cache and source and output and depfile):
        return subprocess.call([real, *args])
    source_hash = _file_hash(source)
    if source_hash is None:
        return subprocess.call([real, *args])
    real_stat = os.stat(real) if os.path.exists(real) else None
    compiler = [real, real_stat.st_size if real_stat else 0, int(real_stat.st_mtime) if real_stat else 0]
    normalized = [a.replace(tree, PLACEHOLDER) for a in args]
    salt = os.environ.get("SPECGEN_OBJECT_CACHE_SALT", "")
    key = hashlib.sha256(json.dumps([compiler, normalized, source_hash, salt]).encode()).hexdigest()
    entry = Path(cache) / key[:2] / key
    name = Path(source).name
    if entry.is_dir():
        for manifest_path in sorted(entry.glob("*.json")):
            try:
                manifest = json.loads(manifest_path.read_text())
            except (OSError, ValueError):
                continue
            if all(_file_hash(dep.replace(PLACEHOLDER, tree)) == digest for dep, digest in manifest["deps"].items()):
                obj = manifest_path.with_suffix(".o")
                try:
                    data = obj.read_bytes()
                except OSError:
                    continue
                _write_atomic(Path(output), data)
                _write_atomic(Path(depfile), manifest["depfile"].replace(PLACEHOLDER, tree).encode())
                _log(f"hit {name}")
                print(f"specgen object cache: reused {name}", file=sys.stderr)
                return 0
    code = subprocess.call([real, *args])
    if code != 0:
        return code
    try:
        text = Path(depfile).read_text()
        deps = {}
        for dep in parse_depfile(text):
            digest = _file_hash(dep)
            if digest is None:
                return code  # a header we cannot read: do not cache
            deps[dep.replace(tree, PLACEHOLDER)] = digest
        variant = hashlib.sha256(json.dumps(sorted(deps.items())).encode()).hexdigest()[:32]
        _write_atomic(entry / f"{variant}.o", Path(output).read_bytes())
        _write_atomic(entry / f"{variant}.json", json.dumps({"deps": deps, "depfile": text.replace(tree, PLACEHOLDER),
                                                               "source": name}).encode())
        _log(f"miss {name}")
    except OSError:
        pass  # the cache is an optimisation: a full disk or a race never fails the build
    return code


def write_launchers(folder: Path, nvcc: str | None, cxx: str) -> dict[str, str]:
    """Scripts `nvcc` and `c++` in `folder` that run the real compilers through this file;
    returns the environment that makes torch's extension build use them."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {}
    for name, real, variable in (("nvcc", nvcc, "PYTORCH_NVCC"), ("c++", cxx, "CXX")):
        if not real:
            continue
        script = folder / name
        command = " ".join(shlex.quote(str(part)) for part in (sys.executable, Path(__file__).resolve(), real))
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        script.chmod(0o755)
        env[variable] = str(script)
    return env


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2:]))
