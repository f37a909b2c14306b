"""The package emitter: model, rendered tree, and (slow, nvcc) a wheel built, installed in a
fresh venv, its generated tests run there, and its Hugging Face hub layout loaded by `kernels`."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.package import emit_package, package_model, render_files
from specgen.package.model import parse_arch_list
from specgen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"

# A small hand-written kernel, so these tests need no generator.
SWIGLU_CU = r"""// A simple SwiGLU kernel for the package tests: out[n, h] = silu(x[n, h]) * x[n, H + h].
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "swiglu_abi.h"

template <typename T>
__global__ void swiglu_fwd(const T* x, T* out, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * H; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n = i / H, h = i % H;
    float g = (float)x[n * 2 * H + h], u = (float)x[n * 2 * H + H + h];
    out[i] = (T)(g / (1.f + __expf(-g)) * u);
  }
}

template <typename T>
__global__ void swiglu_bwd(const T* x, const T* gout, T* gx, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * H; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n = i / H, h = i % H;
    float g = (float)x[n * 2 * H + h], u = (float)x[n * 2 * H + H + h], go = (float)gout[i];
    float s = 1.f / (1.f + __expf(-g));
    gx[n * 2 * H + h] = (T)(go * u * s * (1.f + g * (1.f - s)));
    gx[n * 2 * H + H + h] = (T)(go * g * s);
  }
}

static int blocks_for(int64_t n) { int64_t b = (n + 255) / 256; return (int)(b < 4096 ? (b > 0 ? b : 1) : 4096); }

extern "C" cudaError_t swiglu_forward(const swiglu_args* a, cudaStream_t s) {
  int b = blocks_for(a->N * a->H);
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: swiglu_fwd<<<b, 256, 0, s>>>((const float*)a->x.data, (float*)a->out.data, a->N, a->H); break;
    case SPECGEN_FLOAT16: swiglu_fwd<<<b, 256, 0, s>>>((const __half*)a->x.data, (__half*)a->out.data, a->N, a->H); break;
    case SPECGEN_BFLOAT16: swiglu_fwd<<<b, 256, 0, s>>>((const __nv_bfloat16*)a->x.data, (__nv_bfloat16*)a->out.data, a->N, a->H); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t swiglu_backward(const swiglu_bwd_args* a, cudaStream_t s) {
  int b = blocks_for(a->N * a->H);
  switch (a->x.dtype) {
    case SPECGEN_FLOAT32: swiglu_bwd<<<b, 256, 0, s>>>((const float*)a->x.data, (const float*)a->grad_out.data, (float*)a->grad_x.data, a->N, a->H); break;
    case SPECGEN_FLOAT16: swiglu_bwd<<<b, 256, 0, s>>>((const __half*)a->x.data, (const __half*)a->grad_out.data, (__half*)a->grad_x.data, a->N, a->H); break;
    case SPECGEN_BFLOAT16: swiglu_bwd<<<b, 256, 0, s>>>((const __nv_bfloat16*)a->x.data, (const __nv_bfloat16*)a->grad_out.data, (__nv_bfloat16*)a->grad_x.data, a->N, a->H); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
"""


@pytest.fixture(scope="module")
def specs():
    return [load_spec(SPECS / "swiglu.yaml"), load_spec(SPECS / "cross_entropy.yaml")]


@pytest.fixture(scope="module")
def pkg(specs):
    return package_model("sgtest", specs, {"swiglu": SWIGLU_CU}, arch_list="8.0;9.0+PTX",
                         provenance={"swiglu": {"agent": "hand", "verified_on": None}})


def test_schemas_and_symbol_bindings(pkg):
    swiglu, xent = pkg.ops
    assert swiglu.schema == "(Tensor x) -> Tensor"
    assert swiglu.backward_schema == "(Tensor x, Tensor out, Tensor grad_out) -> Tensor"
    (n, h) = swiglu.bindings
    assert (n.symbol, n.arg, n.axis) == ("N", "x", 0)
    assert (h.symbol, h.axis, h.cpp_expr("s")) == ("H", 1, "(s) / 2")  # x is [N, 2*H]
    assert [d.size_expr() for d in swiglu.outputs[0].dims] == ["N", "H"]
    assert xent.schema == "(Tensor logits, Tensor target) -> Tensor"
    assert xent.outputs[0].dims == () and xent.outputs[0].dtype == "float32"
    assert not xent.has_kernel and swiglu.has_backward_kernel


def test_arch_list_parsing():
    assert parse_arch_list("8.0;9.0+PTX") == [("80", False), ("90", True)]
    assert parse_arch_list("9.0a, 10.0+PTX") == [("90a", False), ("100", True)]
    with pytest.raises(UsageError, match="not a CUDA capability"):
        parse_arch_list("sm_90")


def test_package_name_must_be_an_identifier(specs):
    with pytest.raises(UsageError, match="lowercase identifier"):
        package_model("my-kernels", specs, {})


def test_duplicate_ops_are_refused(specs):
    with pytest.raises(UsageError, match="unique"):
        package_model("dup", [specs[0], specs[0]], {})


def torch_cuda():
    import torch

    return torch.version.cuda


def test_rendered_tree(pkg, tmp_path):
    root = emit_package(pkg, tmp_path / "sgtest")
    files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert {"pyproject.toml", "setup.py", "build.toml", "README.md", "torch-ext/torch_binding.cpp",
            "torch-ext/sgtest/__init__.py", "torch-ext/sgtest/_ops.py", "torch-ext/sgtest/tests/test_ops.py",
            "kernels/swiglu/swiglu.cu", "kernels/swiglu/swiglu_abi.h",
            "torch-ext/sgtest/_reference_cross_entropy.py", "LICENSE", "torch-ext/sgtest/py.typed",
            "torch-ext/sgtest/__init__.pyi", "torch-ext/sgtest/layers.py", "torch-ext/sgtest/_patching.py"} <= files
    assert "kernels/cross_entropy/cross_entropy.cu" not in files  # no kernel: CUDA runs the reference
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")  # every generated Python file parses
    build = tomllib.loads((root / "build.toml").read_text())
    assert build["general"]["name"] == "sgtest" and build["general"]["edition"] == 5
    assert build["kernel"]["swiglu"]["cuda-capabilities"] == ["8.0", "9.0"]
    assert list(build["kernel"]) == ["swiglu"]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == pkg.requirements and project["requires-python"] == ">=3.9"
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    from specgen.package.model import cuda_runtime_requirement

    assert cuda_runtime_requirement("13.0").startswith("nvidia-cuda-runtime>=13,<14")
    assert cuda_runtime_requirement("12.8").startswith("nvidia-cuda-runtime-cu12>=12,<13")
    assert cuda_runtime_requirement(None if torch_cuda() else "") is None or torch_cuda()


def test_binding_uses_only_the_stable_abi_and_never_throws(pkg):
    cpp = render_files(pkg)["torch-ext/torch_binding.cpp"]
    assert "#include <torch/extension.h>" not in cpp and "ATen" not in cpp and "pybind11" not in cpp
    assert f"STABLE_TORCH_LIBRARY_IMPL({pkg.namespace}, CUDA, m)" in cpp and pkg.namespace.startswith("sgtest_")
    assert 'm.impl("_swiglu_kernel", TORCH_BOX(&swiglu_kernel));' in cpp
    assert 'm.impl("_swiglu_backward_kernel", TORCH_BOX(&swiglu_backward_kernel));' in cpp
    assert "cross_entropy" not in cpp.split("STABLE_TORCH_LIBRARY_IMPL")[1]
    assert "aoti_torch_get_current_cuda_stream" in cpp
    # a throw inside a stable-ABI kernel crashed torch 2.11: errors are return codes
    code = "\n".join(line for line in cpp.splitlines() if not line.lstrip().startswith("//"))
    for throwing in ("STD_TORCH_CHECK", "TORCH_CHECK", "throw ", "TORCH_ERROR_CODE_CHECK", "new_empty", "contiguous("):
        assert throwing not in code, throwing
    setup = render_files(pkg)["setup.py"]
    assert "py_limited_api=True" in setup and "TORCH_TARGET_VERSION=0x020a000000000000" in setup


def test_private_kernel_schemas_follow_the_abi_order(pkg):
    swiglu = pkg.ops[0]
    assert swiglu.kernel_schema == "(Tensor in_x, int dim_N, int dim_H, Tensor(a!) out_out) -> int"
    assert swiglu.backward_kernel_schema == ("(Tensor in_x, int dim_N, int dim_H, Tensor fwd_out, "
                                             "Tensor gout_grad_out, Tensor(a!) gin_grad_x) -> int")
    data = swiglu.data()
    assert data["symbols"] == ["N", "H"] and data["kernel_schema"] == swiglu.kernel_schema
    assert pkg.arch_table == [(8, 0, "", False), (9, 0, "", True)]


def test_readme_and_docstrings_say_what_is_verified(pkg):
    files = render_files(pkg)
    readme = files["README.md"]
    assert "`swiglu(x: Tensor[N, 2*H]) -> Tensor[N, H]`" in readme
    assert "Not verified on a GPU" in readme and "No kernel: CUDA runs the reference" in readme
    init = files["torch-ext/sgtest/__init__.py"]
    assert "def swiglu(x: torch.Tensor) -> torch.Tensor:" in init
    assert "NOT verified on a GPU" in init


def test_readme_benchmark_table_names_the_direction_of_each_row(specs):
    from specgen.package.provenance import benchmark_summary

    rows = [{"direction": d, "dims": {"N": 16384, "H": 8192}, "dtype": "bfloat16", "kernel_us": k, "eager_us": 2 * k,
             "compile_us": 1.5 * k, "speedup_vs_eager": 2.0, "speedup_vs_compile": 1.5,
             "kernel_roofline_fraction": 0.9} for d, k in (("forward", 200.0), ("backward", 340.0))]
    provenance = {"swiglu": {"agent": "builtin", "verified_on": "sm_90 (NVIDIA H200)",
                             "verification": {"passed": True},
                             "benchmark": {"device": "NVIDIA H200", "copy_gbs": 4150.0, "rows": rows}}}
    # as the build passes it: the lock's rows through provenance.benchmark_summary
    provenance["swiglu"]["benchmark"] = benchmark_summary(provenance["swiglu"]["benchmark"], ("N", "H"))
    readme = render_files(package_model("sgtest", specs, {"swiglu": SWIGLU_CU}, provenance=provenance))["README.md"]
    assert "| direction | shape | dtype |" in readme
    assert "| forward | N=16384, H=8192 | bfloat16 | 200.0 |" in readme
    assert "| backward | N=16384, H=8192 | bfloat16 | 340.0 |" in readme


def _run_generated_tests(python: str, package: str, cwd: Path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", f"{package}.tests"],
                          cwd=cwd, capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.slow
def test_generated_cpu_tests_pass_from_the_tree(specs, tmp_path):
    """The reference-only package (no compile): its generated tests run on the CPU."""
    pkg = package_model("sgref", specs, {})
    root = emit_package(pkg, tmp_path / "sgref")
    env = dict(os.environ, PYTHONPATH=str(root / "torch-ext"))
    result = _run_generated_tests(sys.executable, "sgref", tmp_path, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


@pytest.mark.slow
@pytest.mark.nvcc
def test_wheel_builds_installs_and_passes_its_tests(pkg, tmp_path):
    from specgen.package import build_wheel, write_hub_layout

    start = time.monotonic()
    root = emit_package(pkg, tmp_path / "sgtest")
    wheel = build_wheel(root, tmp_path / "dist")
    built = time.monotonic() - start
    assert wheel.name.startswith("sgtest-0.1.0-cp39-abi3-") and wheel.name.endswith("_x86_64.whl")  # manylinux with auditwheel

    # a fresh install folder first on the path (works where python is itself a venv, unlike
    # `venv --system-site-packages`); run from tmp_path so no source tree shadows it
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True)
    python = sys.executable
    env = dict(os.environ, PYTHONPATH=str(site))
    result = _run_generated_tests(python, "sgtest", tmp_path, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    probe = subprocess.run([python, "-c", "import torch, sgtest; print(sgtest.CUDA_KERNELS_LOADED, "
                            "torch._C._dispatch_has_kernel_for_dispatch_key(sgtest.NAMESPACE + '::swiglu', 'CUDA'))"],
                           cwd=tmp_path, capture_output=True, text=True, check=True, env=env)
    assert probe.stdout.split() == ["True", "True"]  # the stable-ABI extension loaded and registered

    pytest.importorskip("kernels")
    write_hub_layout(pkg, wheel, tmp_path / "hub", "13.0")
    hub = subprocess.run([python, "-c", "import sys, torch, kernels; k = kernels.get_local_kernel(__import__('pathlib')"
                          ".Path(sys.argv[1])); x = torch.randn(3, 8); "
                          "print(torch.allclose(k.swiglu(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:]))",
                          str(tmp_path / "hub")], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert hub.stdout.strip() == "True", hub.stderr[-2000:]
    print(f"wheel built in {built:.0f} s")
