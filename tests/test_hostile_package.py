"""Issue 14, the generated package: user text never reaches Python or C++ unescaped (case 2),
names that would shadow or break something are refused (case 3), a wheel built --no-verify
warns on import before its kernels load, a kernel that calls what a kernel may not is never
packaged whatever the lock says (case 4), and the package says a lock record proves nothing
(case 12)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from specgen.cli import main
from specgen.errors import UsageError
from specgen.package import emit_package, package_model, render_files
from specgen.package.emit import docstring_text
from specgen.spec import load_spec

from test_build import folder, stub_wheel  # noqa: F401 - fixtures
from test_package import SWIGLU_CU

REPO = Path(__file__).resolve().parent.parent

SPEC = """\
name: {name}
description: {description}
signature: "{name}(x: Tensor[N, D], alpha: float = 2.0) -> Tensor[N, D]"
dtypes: [float32]
dims: {{N: [1, 8], D: [1, 8]}}
reference: |
  def reference(x, alpha=2.0):
      return x * alpha
backward: {backward}
"""

NASTY = [
    '"x\\"\\"\\" ; open(\'PWNED\', \'w\').write(\'1\') ; \\"\\"\\""',  # YAML: x"""; open('PWNED')...; """
    '"see \\\\underline and \\\\u12 and a trailing backslash \\\\"',
    "'ends with a quote \"'",
    '"control \\x01 characters \\t and \\u2028 a line separator"',
]


def spec_file(folder: Path, name: str = "scale", description: str = "Multiply.",  # noqa: F811 - a path argument
              backward: str = "none") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, description=description, backward=backward))
    return path


@pytest.mark.parametrize("description", NASTY)
def test_a_description_is_escaped_in_the_docstring(tmp_path, description):
    spec = load_spec(spec_file(tmp_path, description=description))
    source = render_files(package_model("sgdoc", [spec], {}))["torch-ext/sgdoc/__init__.py"]
    tree = ast.parse(source)  # no SyntaxError, no code outside the docstring
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an invalid escape sequence would warn
        compile(source, "__init__.py", "exec")
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "scale")
    docstring = ast.get_docstring(function, clean=False)
    assert " ".join(spec.description.split()) == " ".join(docstring.split("Signature:")[0].split())
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "open"]


def test_docstring_text_escapes_what_could_end_or_break_a_docstring():
    assert docstring_text('a"""b') == 'a\\"\\"\\"b'
    assert docstring_text("\\underline") == "\\\\underline"
    assert docstring_text("nul\x00 sep\u2028 surrogate\ud800") == "nul\\x00 sep\\u2028 surrogate\\ud800"


def test_importing_the_package_runs_no_code_from_the_description(tmp_path):
    spec = load_spec(spec_file(tmp_path / "specs", description=NASTY[0]))
    root = emit_package(package_model("sgdocimport", [spec], {}), tmp_path / "tree")
    env = dict(os.environ, PYTHONPATH=str(root / "torch-ext"))
    result = subprocess.run([sys.executable, "-c", "import sgdocimport; print(sgdocimport.scale.__doc__)"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "open('PWNED'" in result.stdout and not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("name, words", [
    ("torch", "well-known module"), ("aten", "torch.ops namespace"), ("numpy", "well-known module"),
    ("json", "well-known module"), ("rich", "well-known module"),
])
def test_package_names_that_would_shadow_or_break_are_refused(folder, tmp_path, stub_wheel, capsys, name,  # noqa: F811
                                                              words):
    assert main(["build", str(folder), "--name", name, "-o", str(tmp_path / "dist")]) == 2
    assert words in capsys.readouterr().err and "tree" not in stub_wheel


def test_a_package_name_that_is_already_importable_is_refused(folder, tmp_path, stub_wheel, capsys):  # noqa: F811
    assert main(["build", str(folder), "--name", "pluggy", "-o", str(tmp_path / "dist")]) == 2
    assert "already importable" in capsys.readouterr().err


@pytest.mark.parametrize("version", ['0.1"', "1.0 beta", "", "../x"])
def test_a_malformed_version_is_refused_up_front(folder, tmp_path, stub_wheel, capsys, version):  # noqa: F811
    assert main(["build", str(folder), "--version", version, "-o", str(tmp_path / "dist")]) == 2
    assert "PEP 440" in capsys.readouterr().err and "tree" not in stub_wheel


def test_ops_that_collide_in_one_package_are_refused(tmp_path):
    foo = load_spec(spec_file(tmp_path / "a", "foo", backward="reference"))
    foo_backward = load_spec(spec_file(tmp_path / "b", "foo_backward"))
    with pytest.raises(UsageError, match="collides with the backward op of 'foo'"):
        package_model("sgclash", [foo, foo_backward], {})
    upper = load_spec(spec_file(tmp_path / "c", "Foo"))
    with pytest.raises(UsageError, match="differ only in case"):
        package_model("sgclash", [foo, upper], {})


def test_check_and_generate_refuse_one_op_in_two_files(tmp_path, capsys):
    spec_file(tmp_path / "specs", "scale")
    (tmp_path / "specs" / "scale_copy.yaml").write_text((tmp_path / "specs" / "scale.yaml").read_text())
    assert main(["check", str(tmp_path / "specs")]) == 2
    err = capsys.readouterr().err
    assert "scale_copy.yaml:1:7" in err and "also defined in" in err
    assert main(["generate", str(tmp_path / "specs")]) == 2
    assert "both define the op 'scale'" in capsys.readouterr().err


def test_an_arch_list_with_newlines_is_canonical_in_setup_py(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    pkg = package_model("sgarch", [spec], {"scale": "// kernel"}, arch_list="8.0\n9.0+PTX")
    assert pkg.arch_list == "8.0;9.0+PTX"
    compile(render_files(pkg)["setup.py"], "setup.py", "exec")


# ---------------------------------------------------------------------------- unverified and lock

def test_an_unverified_wheel_warns_on_import_before_its_kernels_load(tmp_path):
    spec = load_spec(REPO / "specs" / "swiglu.yaml")
    pkg = package_model("sgunverified", [spec], {"swiglu": SWIGLU_CU}, provenance={"swiglu": {"agent": "hand"}})
    files = render_files(pkg)
    ops = files["torch-ext/sgunverified/_ops.py"]
    assert ops.index("were NOT verified") < ops.index("from . import _C")
    root = emit_package(pkg, tmp_path / "tree")
    env = dict(os.environ, PYTHONPATH=str(root / "torch-ext"))
    result = subprocess.run([sys.executable, "-c", "import sgunverified"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "UnverifiedKernelWarning" in result.stderr and "swiglu were NOT verified" in result.stderr


def test_the_package_readme_says_a_lock_record_proves_nothing(tmp_path):
    spec = load_spec(REPO / "specs" / "swiglu.yaml")
    readme = render_files(package_model("sgreadme", [spec], {}))["README.md"]
    assert "not a proof" in readme and "specgen\nverify --locked" in readme or "verify --locked" in readme


GETENV_CU = SWIGLU_CU.replace('#include "swiglu_abi.h"', '#include "swiglu_abi.h"\n#include <cstdlib>\n'
                              'volatile long leak;').replace(
    "  int b = blocks_for(a->N * a->H);\n  switch (a->x.dtype) {\n    case SPECGEN_FLOAT32: swiglu_fwd",
    '  leak = (long)getenv("OPENAI_API_KEY");\n  int b = blocks_for(a->N * a->H);\n  switch (a->x.dtype) {\n'
    '    case SPECGEN_FLOAT32: swiglu_fwd', 1)


@pytest.mark.nvcc
@pytest.mark.slow
def test_a_kernel_calling_getenv_is_never_packaged_even_with_no_verify(folder, tmp_path, stub_wheel,  # noqa: F811
                                                                       monkeypatch, capsys):
    from specgen.lock import Lock

    source = GETENV_CU
    assert "getenv" in source
    Lock.load(folder).write_kernel(load_spec(folder / "swiglu.yaml"), source, agent="hand")
    code = main(["build", str(folder / "swiglu.yaml"), "--no-verify", "--arch", "sm_90", "-o", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code == 1 and "getenv" in err and "whatever its lock record says" in err, err
    # the wheel is built in a staging folder and the gate reads its kernels' objects: a refused
    # kernel's wheel never reaches -o (under the stub there is no object: the kernel is compiled alone)
    assert not list((tmp_path / "d").glob("*.whl"))


@pytest.mark.nvcc
@pytest.mark.slow
def test_the_gate_reads_the_object_the_wheel_build_compiled(tmp_path):
    """A real `specgen build` checks the kernel objects of its own wheel build (linked alone),
    not a second compile: a kernel object calling getenv is refused, the clean one passes, and
    the object is found where setuptools' build of the tree puts it."""
    import shutil

    from specgen import abi
    from specgen.package.gate import built_object, object_refusals
    from specgen.toolchain import find_cuda_toolkit

    spec = load_spec(REPO / "specs" / "swiglu.yaml")
    abi.write_header(spec, tmp_path)
    nvcc = str(find_cuda_toolkit().nvcc)
    objects = {}
    for label, source in (("clean", SWIGLU_CU), ("getenv", GETENV_CU)):
        cu = tmp_path / f"{label}.cu"
        cu.write_text(source)
        objects[label] = tmp_path / f"{label}.o"
        subprocess.run([nvcc, "-c", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", f"-I{tmp_path}",
                        "-gencode=arch=compute_90,code=sm_90", str(cu), "-o", str(objects[label])],
                       check=True, capture_output=True, timeout=600)
    assert object_refusals(spec, objects["clean"]) == []
    refusals = object_refusals(spec, objects["getenv"])
    assert any("getenv" in line for line in refusals), refusals

    tree = tmp_path / "tree"
    (tree / "kernels" / "swiglu").mkdir(parents=True)
    (tree / "kernels" / "swiglu" / "swiglu.cu").write_text(SWIGLU_CU)
    assert built_object(tree, "swiglu") is None  # nothing built yet: the gate compiles the kernel alone
    build_temp = tree / "build" / f"temp.linux-x86_64-{sys.implementation.cache_tag}" / "kernels" / "swiglu"
    build_temp.mkdir(parents=True)
    shutil.copy(objects["clean"], build_temp / "swiglu.o")
    assert built_object(tree, "swiglu") == build_temp / "swiglu.o"
