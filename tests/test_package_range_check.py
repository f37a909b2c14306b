"""The device check of integer value ranges (issue 13, "contracts at run time"): which ops the
emitted binding checks on the GPU and with what range, the generic CUDA source compiled by nvcc,
and the package around it (setup.py, MANIFEST, build.toml, the Python entry point). Fast: the
package is emitted, never built (the generated GPU test runs the check on a GPU)."""
from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest

from package_support import import_tree
from specgen.abi import DTYPE_CODES
from specgen.package import emit_package, package_model, render_files
from specgen.signature import INT_DTYPES
from specgen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"

# Two ranged integer inputs of other dtypes, one with a negative low end and a scaled high end.
PICK = textwrap.dedent("""\
    name: pick
    description: Rows of x picked by an index, plus a small integer per row.
    signature: "pick(x: Tensor[N, D], first: Tensor[K] int32 in [-1, N), second: Tensor[K] uint8 in [1, 2*D+1)) -> Tensor[K, D]"
    dtypes: [float32]
    dims: {N: [1, 64], D: [1, 64], K: [1, 64]}
    reference: |
      import torch

      def reference(x, first, second):
          return x[first.long().clamp(min=0)] + second.to(x.dtype)[:, None]
    backward: none
    """)


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("specs")
    (folder / "pick.yaml").write_text(PICK)
    return {"swiglu": load_spec(SPECS / "swiglu.yaml"), "cross_entropy": load_spec(SPECS / "cross_entropy.yaml"),
            "pick": load_spec(folder / "pick.yaml")}


@pytest.fixture(scope="module")
def pkg(specs):
    """cross_entropy and pick with kernels (their sources are not compiled here), swiglu without ranges."""
    kernels = {"swiglu": "// kernel", "cross_entropy": "// kernel", "pick": "// kernel"}
    return package_model("sgrange", list(specs.values()), kernels, arch_list="9.0")


@pytest.fixture(scope="module")
def files(pkg):
    return render_files(pkg)


def _op_blocks(cpp: str) -> dict[str, str]:
    """op name -> its part of the binding (namespace op_<name>)."""
    found = re.findall(r"namespace op_(\w+) \{\n(.*?)\n\}  // namespace op_\1\n", cpp, re.S)
    return dict(found)


CHECK = re.compile(r"check_range\(in_(\w+), (\d+), size_of\(DimSpec\{(-?\d+), (-?\d+), (-?\d+), (-?\d+)\}, call\.dims\), "
                   r"size_of\(DimSpec\{(-?\d+), (-?\d+), (-?\d+), (-?\d+)\}, call\.dims\), device, kSpec\.where\);")


def _forward_body(block: str) -> str:
    """The function that checks and launches the forward: cuda_fwd_saved for an op with saved
    values (its cuda_forward calls it and drops them), cuda_forward otherwise."""
    entry = " cuda_fwd_saved(" if " cuda_fwd_saved(" in block else " cuda_forward("
    return block.split(entry)[1].split("\n}\n")[0]


def _launches(block: str) -> list[tuple[str, int, tuple, tuple]]:
    """The device range checks a forward launches: (argument, site, lo DimSpec, hi DimSpec)."""
    forward = _forward_body(block)
    return [(m[0], int(m[1]), tuple(map(int, m[2:6])), tuple(map(int, m[6:10]))) for m in CHECK.findall(forward)]


def _size(dim_spec, symbols, dims):
    """The binding's size_of: symbol * mul / div + add (floor division), -1: the literal."""
    symbol, mul, div, add = dim_spec
    return add if symbol < 0 else dims[symbols[symbol]] * mul // div + add


def test_the_range_sites_are_the_ranged_integer_inputs_of_ops_with_kernels(pkg, specs):
    swiglu, xent, pick = pkg.ops
    assert swiglu.ranged_inputs == () and [t.name for t in xent.ranged_inputs] == ["target"]
    assert [t.name for t in pick.ranged_inputs] == ["first", "second"]
    assert [(op.name, t.name) for op, t in pkg.range_sites] == [("cross_entropy", "target"), ("pick", "first"),
                                                              ("pick", "second")]
    assert [pkg.range_site(op, t.name) for op, t in pkg.range_sites] == [0, 1, 2]
    no_kernel = package_model("sgnorange", list(specs.values()), {"swiglu": "// kernel"}, arch_list="9.0")
    assert no_kernel.range_sites == []  # a range of an op without a kernel: the reference checks it on CUDA too
    assert [t.name for t in no_kernel.ops[1].ranged_inputs] == ["target"]  # (the model still knows it)


def test_the_binding_launches_the_check_only_for_ops_that_declare_ranges_with_their_ranges(pkg, specs, files):
    cpp = files["torch-ext/torch_binding.cpp"]
    blocks = _op_blocks(cpp)
    assert set(blocks) == {"swiglu", "cross_entropy", "pick"}
    assert _launches(blocks["swiglu"]) == []
    for op in pkg.ops:
        launches = _launches(blocks[op.name])
        assert [name for name, *_ in launches] == [t.name for t in op.ranged_inputs]
        assert [site for _, site, *_ in launches] == [pkg.range_site(op, t.name) for t in op.ranged_inputs]
        # the rendered DimSpecs give, at any sizes, the range the signature resolves to
        params = {p.name: p for p in specs[op.name].signature.params}
        for dims in ({"N": 5, "D": 3, "K": 7, "H": 2, "C": 11}, {"N": 64, "D": 1, "K": 2, "H": 9, "C": 2}):
            for name, _, lo, hi in launches:
                want = tuple(d.resolve(dims) for d in params[name].type.value_range)
                assert (_size(lo, op.symbols, dims), _size(hi, op.symbols, dims)) == want, (op.name, name, dims)
        # before the op's kernel, on the contiguous argument; not in the backward
        forward = _forward_body(blocks[op.name])
        for t in op.ranged_inputs:
            assert forward.index(f"const at::Tensor in_{t.name} = a_{t.name}.contiguous();") < forward.index(
                f"check_range(in_{t.name},") < forward.index(f"{op.name}_forward(&args")
    assert "check_range(" not in cpp.split(" cuda_backward(")[1].split("\n}\n")[0]
    # the site table: what a record's site index names in the error
    table = re.search(r"constexpr RangeSite kRangeSites\[\] = \{\n(.*?)\n\};", cpp, re.S).group(1)
    rows = re.findall(r'\{"([^"]+)", "([^"]+)"\},  // (\d+): ', table)
    assert rows == [(f"{pkg.namespace}.{op.name}", t.name, str(i)) for i, (op, t) in enumerate(pkg.range_sites)]
    assert f"constexpr int kRangeSiteCount = {len(pkg.range_sites)};" in cpp


def test_every_kernel_call_reads_the_record_first_and_the_error_is_worded_as_the_cpu_path(pkg, files):
    cpp = files["torch-ext/torch_binding.cpp"]
    for name, block in _op_blocks(cpp).items():
        for entry in (" cuda_fwd_saved(", " cuda_forward(", " cuda_backward("):
            if entry in block:  # every op with a kernel raises what an earlier call's check found
                body = block.split(entry)[1].split("\n}\n")[0].split("{\n", 1)[1].lstrip()
                # (an op with saved values: cuda_forward calls cuda_fwd_saved, which raises first)
                delegates = entry == " cuda_forward(" and body.startswith("const auto all = cuda_fwd_saved(")
                assert body.startswith("raise_range_violation();") or delegates, (name, entry)
    assert 'm.def("_check_device_contracts() -> ()", &raise_range_violation);' in cpp
    # no iostream formatting of numbers in the new C++: std::to_string, one C string to TORCH_CHECK
    section = cpp.split("integer value ranges, on the device")[1].split("}  // namespace")[0]
    assert "c10::str(" not in section and "ostringstream" not in section
    assert "std::to_string(value)" in section and "TORCH_CHECK(false, message.c_str());" in section
    ops_py = files["torch-ext/sgrange/_ops.py"]
    cpu = re.search(r'holds \{bad\}(.*?)"\)', ops_py, re.S)
    assert cpu, "the CPU path's wording moved"
    cpu_words = re.sub(r'"\s*f"', "", cpu.group(1)).replace("{lo}", "#").replace("{hi}", "#")
    device_words = re.sub(r'"\s*"', "", section).replace('" + std::to_string(lo) + "', "#").replace(
        '" + std::to_string(hi) + "', "#")
    assert cpu_words.startswith(", outside [#, #), the range its signature declares; mask such entries")
    assert cpu_words in device_words  # ", outside [, ), the range its signature declares; mask ... spec"


def test_the_package_compiles_the_check_only_when_an_op_with_a_kernel_declares_a_range(pkg, specs, files, tmp_path):
    assert {"torch-ext/range_check.cu", "torch-ext/range_check.h"} <= set(files)
    assert 'sources += [os.path.join("torch-ext", "range_check.cu")]' in files["setup.py"]
    assert "include torch-ext/range_check.cu torch-ext/range_check.h" in files["MANIFEST.in"]
    build = tomllib.loads(files["build.toml"])
    assert build["kernel"]["specgen_range_check"]["src"] == ["torch-ext/range_check.cu", "torch-ext/range_check.h"]
    assert '#include "range_check.h"' in files["torch-ext/torch_binding.cpp"]
    # the header's element types are the kernel ABI's dtype codes (the binding passes dtype_code())
    defined = dict(re.findall(r"#define SPECGEN_RANGE_(\w+) (\d+)\n", files["torch-ext/range_check.h"]))
    assert {k: int(v) for k, v in defined.items() if k.lower() in INT_DTYPES} == {d.upper(): DTYPE_CODES[d]
                                                                                 for d in INT_DTYPES}
    plain = package_model("sgplain", [specs["swiglu"], specs["cross_entropy"]], {"swiglu": "// kernel"},
                          arch_list="9.0")
    plain_files = render_files(plain)
    assert not any("range_check" in path for path in plain_files)
    for path in ("setup.py", "MANIFEST.in", "build.toml", "torch-ext/torch_binding.cpp"):
        assert "range_check" not in plain_files[path] and "raise_range_violation" not in plain_files[path], path
    assert "check_device_contracts()" not in plain_files["README.md"]
    readme = files["README.md"]
    assert "`cross_entropy`'s `target` in `[0, C)`" in readme and "**next** call" in readme


def test_the_build_toml_with_the_check_is_accepted_by_the_kernels_parser(pkg, tmp_path):
    rust = pytest.importorskip("kernels._rust")
    root = emit_package(pkg, tmp_path / "tree")
    rust.Build.open(root)  # raises ValueError on a schema violation


def test_check_device_contracts_is_public_and_silent_without_the_compiled_binding(pkg, tmp_path):
    pytest.importorskip("torch")
    root = emit_package(pkg, tmp_path / "sgrange")
    with pytest.warns(UserWarning, match="NOT verified"):  # built as if with --no-verify
        module = import_tree(root, "sgrange")
    assert "check_device_contracts" in module.__all__
    assert not module.CUDA_KERNELS_LOADED  # an emitted tree: no _C
    assert module.check_device_contracts() is None
    stub = (root / "torch-ext" / "sgrange" / "__init__.pyi").read_text()
    assert "def check_device_contracts(synchronize: bool = True) -> None: ..." in stub
    tests = (root / "torch-ext" / "sgrange" / "tests" / "test_ops.py").read_text()
    compile(tests, "test_ops.py", "exec")
    assert "def test_an_integer_input_outside_its_range_is_a_clear_error_on_the_gpu_at_the_next_call(name):" in tests


@pytest.mark.nvcc
def test_the_range_check_compiles_with_nvcc_and_exports_its_entry_point(files, tmp_path):
    from specgen.toolchain import find_cuda_toolkit

    toolkit = find_cuda_toolkit()

    def compile_in(where: Path) -> Path:
        folder = where / "torch-ext"
        folder.mkdir(parents=True)
        for name in ("range_check.cu", "range_check.h", "glibc_compat.h"):
            (folder / name).write_text(files[f"torch-ext/{name}"])
        obj = where / "range_check.o"
        # as setup.py compiles it (torch's own nvcc flags aside): the glibc header first, plain half types
        done = subprocess.run([str(toolkit.nvcc), "-std=c++17", "-O3", "-U__CUDA_NO_HALF_OPERATORS__",
                               "-U__CUDA_NO_HALF_CONVERSIONS__", "-gencode=arch=compute_90,code=sm_90",
                               "-gencode=arch=compute_80,code=compute_80", "-Xcompiler=-fPIC,-Wall,-Wextra,-Werror",
                               f"-Xcompiler=-ffile-prefix-map={where}=.", "-include", str(folder / "glibc_compat.h"),
                               "-c", str(folder / "range_check.cu"), "-o", str(obj)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        return obj

    obj, elsewhere = compile_in(tmp_path / "one"), compile_in(tmp_path / "two" / "deeper")
    folder = tmp_path / "one" / "torch-ext"
    strip = shutil.which("strip")
    if strip:  # the build's temporary folder changes no byte the wheel keeps (the link strips the symbol table)
        stripped = [obj.with_suffix(".s.o"), elsewhere.with_suffix(".s.o")]
        for source, target in zip((obj, elsewhere), stripped):
            subprocess.run([strip, "--strip-debug", "--discard-all", "-o", str(target), str(source)], check=True)
        assert stripped[0].read_bytes() == stripped[1].read_bytes()
    nm = shutil.which("nm")
    if nm:
        symbols = subprocess.run([nm, "-g", "--defined-only", str(obj)], capture_output=True, text=True).stdout
        assert re.search(r" T specgen_range_check$", symbols, re.M), symbols  # extern "C", what the binding calls
    # the header is C as well as C++ (the binding's c++ includes it beside the kernels' ABI headers)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        done = subprocess.run([cc, "-fsyntax-only", "-Wall", "-Werror", f"-I{toolkit.include_dir}", "-x", "c",
                               str(folder / "range_check.h")], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-4000:]
