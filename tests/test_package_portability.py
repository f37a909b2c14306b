"""The build reports which glibc a wheel needs, so a wheel that won't load on older Linux is named."""
from __future__ import annotations

import shutil
import subprocess
import zipfile

import pytest

from specgen.package.portability import glibc_needs, portability_warning

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("readelf") is None,
                                reason="needs a C compiler and readelf")

# pthread_once moved into libc proper in glibc 2.34: a library built against glibc >= 2.34 needs it.
NEW_SYMBOL = "#include <pthread.h>\nstatic pthread_once_t o = PTHREAD_ONCE_INIT; static void f(void) {}\n" \
             "int use(void) { return pthread_once(&o, f); }\n"
OLD_SYMBOL = "#include <string.h>\nsize_t use(const char* s) { return strlen(s); }\n"


def _library(tmp_path, source, name):
    (tmp_path / f"{name}.c").write_text(source)
    library = tmp_path / f"lib{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(tmp_path / f"{name}.c"), "-o", str(library)], check=True)
    return library


def _wheel(tmp_path, library):
    wheel = tmp_path / "demo-0.1-cp39-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(library, f"demo/{library.name}")
        archive.writestr("demo/__init__.py", "")
    return wheel


def test_a_new_glibc_symbol_is_reported(tmp_path):
    library = _library(tmp_path, NEW_SYMBOL, "new")
    needs = glibc_needs(library)
    if needs.get("pthread_once", (0, 0)) < (2, 34):
        pytest.skip("this machine's glibc predates 2.34")
    warning = portability_warning(_wheel(tmp_path, library), floor=(2, 28))
    assert warning is not None and "glibc >= 2.34" in warning and "pthread_once (GLIBC_2.34)" in warning


def test_an_old_symbol_passes(tmp_path):
    library = _library(tmp_path, OLD_SYMBOL, "old")
    assert max(glibc_needs(library).values()) <= (2, 28)
    assert portability_warning(_wheel(tmp_path, library)) is None
