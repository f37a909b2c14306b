"""The build reports which glibc a wheel needs, so a wheel that won't load on older Linux is named."""
from __future__ import annotations

import shutil
from pathlib import Path
import subprocess
import zipfile

import pytest

from specgen.package.portability import glibc_needs, portability_warning
from specgen.toolchain import undefined_dynamic_symbols

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


# What a libstdc++.a built against glibc >= 2.38 does: call the C23 names of strtoul & co.
C23_CALLER = "unsigned long __isoc23_strtoul(const char*, char**, int);\n" \
             "unsigned long parse(const char* s) { return __isoc23_strtoul(s, 0, 10); }\n"


def _shared(tmp_path, name, sources, compiler="cc"):
    library = tmp_path / f"lib{name}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-I", str(tmp_path), *map(str, sources), "-o", str(library)],
                   check=True, capture_output=True)
    return library


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_the_generated_shims_resolve_c23_strtol_names_inside_the_extension(tmp_path):
    from specgen.package.emit import environment  # the package templates, as the emitter loads them

    env = environment()
    (tmp_path / "glibc_compat.h").write_text(env.get_template("torch-ext/glibc_compat.h.j2").render())
    (tmp_path / "glibc_shims.cpp").write_text(env.get_template("torch-ext/glibc_shims.cpp.j2").render())
    (tmp_path / "caller.c").write_text(C23_CALLER)
    subprocess.run(["cc", "-c", "-fPIC", str(tmp_path / "caller.c"), "-o", str(tmp_path / "caller.o")], check=True)
    subprocess.run(["c++", "-c", "-fPIC", "-include", str(tmp_path / "glibc_compat.h"), str(tmp_path / "glibc_shims.cpp"),
                    "-o", str(tmp_path / "shims.o")], check=True)

    without = _shared(tmp_path, "without", [tmp_path / "caller.o"])
    with_shims = _shared(tmp_path, "with", [tmp_path / "caller.o", tmp_path / "shims.o"], compiler="c++")
    imported = lambda lib: {s.name for s in undefined_dynamic_symbols(lib)}  # noqa: E731
    assert "__isoc23_strtoul" in imported(without)  # the problem, as the H200's wheel had it
    assert "__isoc23_strtoul" not in imported(with_shims)
    assert "strtoul" in imported(with_shims)  # the classic symbol, which every glibc has
    exported = subprocess.run(["nm", "-D", "--defined-only", str(with_shims)], capture_output=True, text=True).stdout
    assert "__isoc23" not in exported  # hidden: the shims are not part of the extension's interface


# The H200's toolchain links libstdc++ statically into the extension; torch has the shared one
# loaded. Two C++ runtimes in one process: formatting an integer in the copy read torch's locale
# facets with the copy's indices (the generated op's error messages died of a segfault there).
FORMATS_AN_INTEGER = '#include <sstream>\n#include <string>\n' \
                     'extern "C" const char* format(long v) { static std::string out; std::ostringstream s;' \
                     ' s << "v=" << v; out = s.str(); return out.c_str(); }\n'
CALL_AFTER_THE_SHARED_RUNTIME_FORMATTED = """
import ctypes, sys
for path in sys.argv[1:]:  # first a library on the shared runtime (as torch, formatting numbers on import)
    library = ctypes.CDLL(path); library.format.restype = ctypes.c_char_p
    said = library.format(42).decode()
print(said)
"""


def _setup_function(name):
    """One function of the generated setup.py (the file runs setup() when executed whole)."""
    import ast

    from specgen.package import package_model, render_files
    from specgen.spec import load_spec
    from test_package import SPECS, SWIGLU_CU

    source = render_files(package_model("sgport", [load_spec(SPECS / "swiglu.yaml")], {"swiglu": SWIGLU_CU}))["setup.py"]
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = {"os": __import__("os")}
    exec(compile(ast.Module([node], []), "setup.py", "exec"), scope)
    return scope[name]


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_the_extension_links_the_processes_libstdcxx_even_where_the_toolchain_links_it_statically(tmp_path):
    import ctypes
    import sys

    ctypes.CDLL("libstdc++.so.6")  # importing torch maps it before setup.py asks
    libstdcxx = _setup_function("loaded_libstdcxx")()
    assert libstdcxx is not None and Path(libstdcxx).name.startswith("libstdc++.so.6"), libstdcxx
    (tmp_path / "fmt.cpp").write_text(FORMATS_AN_INTEGER)

    def link(name, extra):
        library = tmp_path / f"lib{name}.so"
        subprocess.run(["c++", "-shared", "-fPIC", "-O2", str(tmp_path / "fmt.cpp"), *extra, "-o", str(library)],
                       check=True, capture_output=True)
        return library

    torch_like = link("shared", [])

    def call(name, extra):  # -static-libstdc++: what /opt/gcc's g++ does by default
        library = link(name, ["-static-libstdc++", *extra])
        return subprocess.run([sys.executable, "-c", CALL_AFTER_THE_SHARED_RUNTIME_FORMATTED, str(torch_like),
                               str(library)], capture_output=True, text=True)

    static = call("static", [])
    assert static.returncode != 0 or static.stdout.strip() != "v=42"  # the problem: the number is lost (or a crash)
    fixed = call("fixed", [libstdcxx])
    assert fixed.returncode == 0 and fixed.stdout.strip() == "v=42", fixed.stderr
