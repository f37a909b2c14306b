"""CI's check that a compiled wheel can be published and rebuilt: the same specs built twice,
from two different folders, give the same wheel bytes. One pair of builds serves every
assertion (compiling against torch's headers takes minutes on the 2-core machine)."""
from __future__ import annotations

import hashlib
import os
import time
import importlib.util
import shutil
import tarfile
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specgen.package import build_wheel, emit_package, package_model
from specgen.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_package import SPECS, SWIGLU_CU  # noqa: E402  (the hand-written kernel: no generator needed)

pytestmark = [pytest.mark.slow, pytest.mark.nvcc]


def _package():
    return package_model("sgrepro_cu", [load_spec(SPECS / "swiglu.yaml"), load_spec(SPECS / "rmsnorm.yaml")],
                         {"swiglu": SWIGLU_CU}, arch_list="9.0")  # one target: half the compile time


def _build(tree: Path, dist: Path, cache: Path, emit: bool = True, sdist: bool = True) -> tuple[Path, float]:
    """One wheel build (of the package emitted into `tree`, or of the tree as it is) with an
    object cache of its own (SPECGEN_OBJECT_CACHE); run in a child process, so two builds can
    run at once, each with its own environment."""
    os.environ["SPECGEN_OBJECT_CACHE"] = str(cache)
    if emit:
        tree = emit_package(_package(), tree)
    started = time.monotonic()
    wheel = build_wheel(tree, dist, sdist=sdist)
    return wheel, time.monotonic() - started


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("no nvcc: the compiled wheel cannot be built here")
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    base = tmp_path_factory.mktemp("repro")
    pkg = _package()
    # two builds with caches of their own (nothing reused: the bytes are the compilers'), at once
    # (each compiles the binding on one core for most of its time), then a third from yet another
    # folder with the first one's cache: it compiles nothing
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        cold = [pool.submit(_build, base / where / "sgrepro_cu", base / where / "dist", base / cache)
                for where, cache in (("one", "cache1"), ("two/deeper", "cache2"))]
        built = [future.result() for future in cold]
        built.append(pool.submit(_build, base / "three" / "sgrepro_cu", base / "three" / "dist",
                                 base / "cache1").result())
        # the source archive of the first build, unpacked elsewhere, rebuilds the same wheel
        with tarfile.open(next((base / "one" / "dist").glob("*.tar.gz"))) as archive:
            archive.extractall(base / "from_sdist", filter="data")
        (unpacked,) = (base / "from_sdist").iterdir()
        built.append(pool.submit(_build, unpacked, base / "from_sdist_dist", base / "cache1", emit=False,
                                 sdist=False).result())
    wheels, seconds = [wheel for wheel, _ in built], [took for _, took in built]
    return pkg, wheels, seconds


def test_the_same_specs_give_the_same_wheel_bytes(two_builds):
    _, (first, second, _, _), _ = two_builds
    assert first.name == second.name
    if importlib.util.find_spec("auditwheel") and shutil.which("patchelf"):
        assert "-cp39-abi3-manylinux_2_" in first.name, first.name  # auditwheel retagged it
    else:
        assert first.name.endswith("-cp39-abi3-linux_x86_64.whl")
    assert hashlib.sha256(first.read_bytes()).hexdigest() == hashlib.sha256(second.read_bytes()).hexdigest()
    sdists = [next(w.parent.glob("*.tar.gz")) for w in (first, second)]
    assert sdists[0].read_bytes() == sdists[1].read_bytes()


def test_the_wheel_carries_license_types_and_its_runtime_dependency(two_builds):
    pkg, (wheel, _, _, _), _ = two_builds
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    for member in ("sgrepro_cu/py.typed", "sgrepro_cu/__init__.pyi", "sgrepro_cu/layers.py",
                   "sgrepro_cu-0.1.0.dist-info/licenses/LICENSE"):
        assert member in names
    metadata = archive.read("sgrepro_cu-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    if pkg.cuda_runtime_requirement:
        name = pkg.cuda_runtime_requirement.split(">=")[0]
        assert f"Requires-Dist: {name}" in metadata  # the libcudart the extension links
    so = next(n for n in names if n.endswith(".so"))
    assert all(date == (1980, 1, 1, 0, 0, 0) for date in (i.date_time for i in archive.infolist()))
    readelf = shutil.which("readelf")
    if readelf:
        path = wheel.parent / "ext.so"
        path.write_bytes(archive.read(so))
        needed = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True).stdout
        assert "libcudart.so" in needed
        strings = path.read_bytes()
        assert str(wheel.parent.parent).encode() not in strings  # no build path in the binary


def test_an_unchanged_rebuild_reuses_every_compiled_object(two_builds):
    _, (first, _, third, _), seconds = two_builds
    assert third.read_bytes() == first.read_bytes()
    log = next(third.parent.glob("*.build.log")).read_text()
    assert log.count("specgen object cache: reused") == 3  # the binding, the shims and the kernel: no compile
    print(f"build seconds: first {seconds[0]:.0f}, same specs with an empty cache {seconds[1]:.0f}, "
          f"unchanged with the cache {seconds[2]:.0f}")  # the rest is torch imports, the link and auditwheel


def test_the_sdist_rebuilds_the_same_wheel(two_builds):
    _, (first, _, _, from_sdist), _ = two_builds
    assert from_sdist.name == first.name and from_sdist.read_bytes() == first.read_bytes()
