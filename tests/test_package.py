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

from package_support import unbatched_spec
from specgen.errors import UsageError
from specgen.package import emit_package, package_model, render_files
from specgen.package.model import parse_arch_list
from specgen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"


def _plain_swiglu():
    return unbatched_spec(SPECS / "swiglu.yaml")  # the plain op's registrations; the batched: test_batch_package


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
    return [_plain_swiglu(), load_spec(SPECS / "cross_entropy.yaml")]


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


# The same kernel with a size function for its forward (the binding allocates what it asks for).
SWIGLU_WS_CU = SWIGLU_CU + r"""
extern "C" size_t swiglu_forward_workspace(const swiglu_args* a) { return (size_t)a->N * 16; }
"""


def _binding(source: str) -> str:
    model = package_model("sgtest", [_plain_swiglu()], {"swiglu": source}, arch_list="9.0")
    return render_files(model)["torch-ext/torch_binding.cpp"]


def test_binding_allocates_the_workspace_only_for_a_kernel_that_asks():
    """From the caching allocator on the call's stream (no cudaMalloc, capturable), after the
    arguments are filled (the size function sees them), before the launch; none otherwise."""
    cpp = _binding(SWIGLU_WS_CU)
    assert "at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device))" in cpp
    forward = cpp.split("cuda_forward(")[1].split("cuda_backward(")[0]
    asked = forward.index("attach_workspace(args, swiglu_forward_workspace(&args), device, kSpec.where);")
    assert forward.index("args.out = ") < asked < forward.index("check_launch(swiglu_forward(")
    backward = cpp.split("cuda_backward(")[1]
    assert "attach_workspace(args" not in backward
    assert "args.workspace = workspace.data_ptr();" in cpp and "args.workspace_bytes = workspace.numel();" in cpp
    plain = _binding(SWIGLU_CU)
    assert "attach_workspace(args" not in plain


def test_binding_allocates_the_backward_workspace_of_a_builtin_kernel():
    """rmsnorm's builtin kernel: column partials (the weight's gradient) in its backward only."""
    from specgen.agents.builtin import build_source

    spec = load_spec(SPECS / "rmsnorm.yaml")
    model = package_model("sgtest", [spec], {"rmsnorm": build_source(spec)}, arch_list="9.0")
    cpp = render_files(model)["torch-ext/torch_binding.cpp"]
    forward, backward = cpp.split("cuda_backward(")[0].split("cuda_forward(")[1], cpp.split("cuda_backward(")[1]
    assert "attach_workspace(args" not in forward
    assert "attach_workspace(args, rmsnorm_backward_workspace(&args), device, kSpec.backward_where);" in backward


@pytest.mark.nvcc
def test_the_gate_refuses_a_size_function_the_binding_would_not_call():
    from specgen.package.gate import kernel_refusals

    spec = _plain_swiglu()
    assert kernel_refusals(spec, SWIGLU_WS_CU, arch="sm_90") == []
    hidden = SWIGLU_CU + '\n#define WS(op) op##_forward_workspace\nextern "C" size_t WS(swiglu)(const swiglu_args*) { return 0; }\n'
    assert any("without spelling its name" in r for r in kernel_refusals(spec, hidden, arch="sm_90"))
    named = SWIGLU_CU + "\n// swiglu_backward_workspace: not needed\n"
    assert any("does not define it" in r for r in kernel_refusals(spec, named, arch="sm_90"))


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


def test_binding_is_the_cuda_and_autograd_implementation_in_cpp(pkg):
    """No Python per call: the public ops' CUDA and Autograd kernels are the binding's C++."""
    cpp = render_files(pkg)["torch-ext/torch_binding.cpp"]
    ns = pkg.namespace
    assert ns.startswith("sgtest_") and "#include <torch/library.h>" in cpp and "pybind11" not in cpp
    assert "torch/extension.h" not in cpp and "torch/csrc/stable" not in cpp
    cuda = cpp.split(f"TORCH_LIBRARY_IMPL({ns}, CUDA, m) {{")[1].split("}")[0]
    assert 'm.impl("swiglu", TORCH_FN(op_swiglu::cuda_forward));' in cuda
    assert 'm.impl("swiglu_backward", TORCH_FN(op_swiglu::cuda_backward));' in cuda
    assert "cross_entropy" not in cuda  # no kernel: Python registers the reference for CUDA
    autograd = cpp.split(f"TORCH_LIBRARY_IMPL({ns}, Autograd, m) {{")[1].split("}")[0]
    assert autograd.strip() == 'm.impl("swiglu", TORCH_FN(op_swiglu::autograd_forward));'
    # x: Tensor[N, 2*H]: H is read from x's axis 1 as size / 2, and the axis is re-checked as 2*H
    assert '{"x", kWorking, "[N, 2*H]", {{0, 1, 1, 0}, {1, 2, 1, 0}}},' in cpp
    assert "{1, 0, 1, 2, 1, 0},  // H from x axis 1" in cpp
    assert '{"out", kWorking, "[N, H]", {{0, 1, 1, 0}, {1, 1, 1, 0}}},' in cpp
    for check in ('spec.dims.size(), "-d ", spec.shape_text, ", got shape "', '") gives no whole "',
                  '" but the other arguments make it "',
                  '"; supported dtypes: "', '"; floating arguments share one dtype"',
                  '"; pass every tensor on one device (CUDA runs the kernel, the CPU the reference)"',
                  '": this wheel has no code for this GPU ("', "cudaGetErrorString(error)",
                  "c10::cuda::CUDAGuard guard(device)", "c10::cuda::getCurrentCUDAStream(device.index())",
                  "at::empty(sizes, at::TensorOptions().dtype(dtype).device(device))",
                  "const at::Tensor in_x = a_x.contiguous();", "if (out_out.numel() > 0) {",
                  "check_launch(swiglu_forward(&args, stream_of(device)), kSpec.where);",
                  "at::AutoDispatchBelowADInplaceOrView guard;", ": double backward is not supported"):
        assert check in cpp, check
    # sizes outside the spec's dims: said once per op (swiglu: N in [1, 65536], H in [1, 16384])
    import re
    ranges = re.search(r'"float32, float16, bfloat16",\n    \{(\{[^\n]*\})\},\n\};', cpp.split("op_swiglu")[1])
    spec_ranges = _plain_swiglu().dims
    assert ranges and ranges.group(1) == ", ".join(f"{{{lo}, {hi}}}" for lo, hi in
                                                  (spec_ranges[s] for s in ("N", "H")))
    assert "warn_outside_ranges(op, where, call.dims);" in cpp and "op.warned_outside.exchange(true)" in cpp
    # the first call on a device keeps the default pool's freed workspaces (as the verifier's process does)
    first_call = cpp.split("if (state == 0) {")[1].split("}")[0]
    assert "keep_freed_workspaces(index);" in first_call
    assert "cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep)" in cpp
    # the forward op is called through the dispatcher below autograd, the backward op through it too
    assert f'findSchemaOrThrow("{ns}::swiglu", "")' in cpp and f'findSchemaOrThrow("{ns}::swiglu_backward", "")' in cpp
    setup = render_files(pkg)["setup.py"]
    assert "py_limited_api=True" in setup and "_GLIBCXX_USE_CXX11_ABI" in setup
    assert f"TORCH_VERSION = ({pkg.torch_version[0]}, {pkg.torch_version[1]})" in setup


@pytest.mark.slow
def test_the_binding_compiles_against_the_installed_torch(specs, tmp_path):
    """Every example spec's binding (the committed kernels' headers) compiles with this torch's
    headers: one translation unit, syntax and types only (the wheel test links and loads one)."""
    import glob

    from package_support import binding_syntax_errors

    all_specs = [load_spec(p) for p in sorted(glob.glob(str(SPECS / "*.yaml")))]
    kernels = {s.name: (SPECS / "kernels" / f"{s.name}.cu").read_text() for s in all_specs
               if (SPECS / "kernels" / f"{s.name}.cu").exists()}
    kernels["swiglu"] = SWIGLU_WS_CU  # a kernel with a size function: the binding allocates its workspace
    pkg = package_model("sgall", all_specs, kernels, arch_list="9.0")
    root = emit_package(pkg, tmp_path / "sgall")
    assert binding_syntax_errors(root, list(kernels)) == ""


def test_kernel_params_follow_the_abi_order(pkg):
    swiglu = pkg.ops[0]
    assert [(p.field, p.name) for p in swiglu.kernel_params("forward")] == [
        ("x", "in_x"), ("N", "dim_N"), ("H", "dim_H"), ("out", "out_out")]
    assert [p.name for p in swiglu.kernel_params("backward")] == ["in_x", "dim_N", "dim_H", "fwd_out",
                                                                  "gout_grad_out", "gin_grad_x"]
    assert swiglu.cpp_backward_params == "const at::Tensor& a_x, const at::Tensor& a_out, const at::Tensor& a_grad_out"
    data = swiglu.data()
    assert data["symbols"] == ["N", "H"] and "kernel_schema" not in data
    assert pkg.arch_table == [(8, 0, "", False), (9, 0, "", True)]


def test_the_wheel_requires_the_torch_it_was_built_against(pkg, specs):
    torch = pytest.importorskip("torch")
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    assert pkg.torch_version == (major, minor)
    assert pkg.requirements[0] == f"torch>={major}.{minor},<{major}.{minor + 1}"
    project = tomllib.loads(render_files(pkg)["pyproject.toml"])
    assert project["project"]["dependencies"][0] == pkg.requirements[0]
    pure = package_model("sgpure", specs, {})  # no compiled code: no upper pin
    assert pure.requirements[0] == "torch>=2.10"
    from specgen.package.hub import variant_name

    abi = "cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "cxx98"
    assert variant_name(pkg, "13.0").startswith(f"torch{major}{minor}-{abi}-cu130-")
    assert variant_name(pure, "13.0").startswith("torch-stable-abi210-cu130-")


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


# Where each kernel of the installed wheel comes from, by the dispatcher's own table.
PROBE = """
import torch, sgtest
print(f"loaded={sgtest.CUDA_KERNELS_LOADED}")
def origin(op, key):
    name = sgtest.NAMESPACE + "::" + op
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (op, key)
    row = "AutogradCPU:" if key == "Autograd" else key + ":"  # the alias key's rows name each backend
    line = next(l for l in torch._C._dispatch_dump_table(name).splitlines() if l.startswith(row))
    return "cpp" if "torch_binding.cpp" in line else "python" if "_ops.py" in line else line
for op, key in (("swiglu", "CUDA"), ("swiglu", "Autograd"), ("swiglu_backward", "CUDA"),
                ("cross_entropy", "CUDA"), ("cross_entropy", "Autograd")):
    print(f"{op}:{key}={origin(op, key)}")
x = torch.randn(3, 8, requires_grad=True)
y = sgtest.swiglu(x)
print("cpu=" + ("reference" if torch.allclose(y, torch.nn.functional.silu(x[:, :4]) * x[:, 4:]) else "wrong"))
(g,) = torch.autograd.grad(y.sum(), x)
ref = torch.func.grad(lambda t: (torch.nn.functional.silu(t[:, :4]) * t[:, 4:]).sum())(x.detach())
print("grad=" + ("ok" if torch.allclose(g, ref, atol=1e-5) and "OpFunction" in y.grad_fn.name() else "wrong " + y.grad_fn.name()))
# the C++ CUDA kernels' checks throw (a RuntimeError here, no crash): reached on the CPU by redispatching
ns = getattr(torch.ops, sgtest.NAMESPACE)
cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
for call, want in ((lambda: ns.swiglu.default.redispatch(cuda, torch.randn(2, 4)), "swiglu: the CUDA kernel got tensors on cpu"),
                   (lambda: ns.swiglu_backward.default.redispatch(cuda, torch.randn(2, 4), torch.empty(2, 2, device="meta"),
                                                                  torch.randn(2, 2)),
                    "swiglu_backward: out is on meta but x is on cpu; pass every tensor on one device")):
    try:
        call()
        print("error=none")
    except RuntimeError as error:
        print("error=" + ("clear" if want in str(error) else "unclear " + str(error)))
"""


@pytest.mark.slow
@pytest.mark.nvcc
def test_wheel_builds_installs_and_passes_its_tests(pkg, tmp_path):
    from specgen.package import build_wheel, write_hub_layout

    import dataclasses

    # one CUDA target (this test checks no arch list; test_kernel_params_follow_the_abi_order does)
    pkg = dataclasses.replace(pkg, arch_list="9.0+PTX")
    start = time.monotonic()
    root = emit_package(pkg, tmp_path / "sgtest")
    wheel = build_wheel(root, tmp_path / "dist")
    built = time.monotonic() - start
    assert wheel.name.startswith("sgtest-0.1.0-cp39-abi3-") and wheel.name.endswith("_x86_64.whl")  # manylinux with auditwheel
    import zipfile

    metadata = zipfile.ZipFile(wheel).read("sgtest-0.1.0.dist-info/METADATA").decode()
    major, minor = pkg.torch_version
    assert f"Requires-Dist: torch<{major}.{minor + 1},>={major}.{minor}" in metadata \
        or f"Requires-Dist: torch>={major}.{minor},<{major}.{minor + 1}" in metadata, metadata

    # a fresh install folder first on the path (works where python is itself a venv, unlike
    # `venv --system-site-packages`); run from tmp_path so no source tree shadows it
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True)
    python = sys.executable
    env = dict(os.environ, PYTHONPATH=str(site))
    result = _run_generated_tests(python, "sgtest", tmp_path, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    probe = subprocess.run([python, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, check=True, env=env)
    # the extension loaded; swiglu's CUDA and Autograd kernels (and its backward's CUDA kernel) are
    # the binding's C++, not Python; cross_entropy (no kernel) keeps the Python reference and autograd
    assert probe.stdout.split() == ["loaded=True", "swiglu:CUDA=cpp", "swiglu:Autograd=cpp",
                                    "swiglu_backward:CUDA=cpp", "cross_entropy:CUDA=python",
                                    "cross_entropy:Autograd=python", "cpu=reference", "grad=ok", "error=clear",
                                    "error=clear"], probe.stdout

    pytest.importorskip("kernels")
    write_hub_layout(pkg, wheel, tmp_path / "hub", "13.0")
    hub = subprocess.run([python, "-c", "import sys, torch, kernels; k = kernels.get_local_kernel(__import__('pathlib')"
                          ".Path(sys.argv[1])); x = torch.randn(3, 8); "
                          "print(torch.allclose(k.swiglu(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:]))",
                          str(tmp_path / "hub")], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert hub.stdout.strip() == "True", hub.stderr[-2000:]
    print(f"wheel built in {built:.0f} s")
