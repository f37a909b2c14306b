"""The package of an op with saved intermediates (issue 13): the public op keeps its schema, the
internal `<op>_fwd_saved` returns the outputs and the saved values, `<op>_backward` takes them,
and the binding's autograd saves them for it (docs/ARCHITECTURE.md "Saved intermediates")."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from package_support import import_tree
from specgen.agents.builtin.generator import build_source
from specgen.package.emit import emit_package, render_files
from specgen.package.model import package_model
from specgen.spec import load_spec

SAVED = Path(__file__).resolve().parent / "saved_specs"
SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.fixture(scope="module")
def specs():
    return [load_spec(SAVED / "cross_entropy_lse.yaml"), load_spec(SAVED / "rmsnorm_rstd.yaml")]


@pytest.fixture(scope="module")
def pkg(specs):
    return package_model("sgsaved", specs, {s.name: build_source(s) for s in specs}, arch_list="9.0")


def test_the_public_schema_hides_them_and_the_internal_ops_carry_them(pkg):
    ce = pkg.ops[0]
    assert ce.schema == "(Tensor logits, Tensor target) -> Tensor"  # as specs/cross_entropy.yaml's
    assert ce.fwd_saved_schema == "(Tensor logits, Tensor target) -> (Tensor, Tensor)"
    assert ce.backward_schema == ("(Tensor logits, Tensor target, Tensor out, Tensor saved_lse, Tensor grad_out) "
                                  "-> Tensor")
    assert [(p.field, p.name) for p in ce.kernel_params("forward") if p.is_tensor] == [
        ("logits", "in_logits"), ("target", "in_target"), ("out", "out_out"), ("saved_lse", "sv_saved_lse")]
    assert ("saved_lse", "svin_saved_lse") in [(p.field, p.name) for p in ce.kernel_params("backward")]


def test_an_op_without_saved_values_renders_as_before(tmp_path):
    from builtin_support import without_saved

    plain = package_model("sgplain", [without_saved(SPECS / "cross_entropy.yaml", tmp_path)],
                          {"cross_entropy": (SPECS / "kernels" / "cross_entropy.cu").read_text()}, arch_list="9.0")
    op = plain.ops[0]
    assert op.backward_schema == "(Tensor logits, Tensor target, Tensor out, Tensor grad_out) -> Tensor"
    assert "saved" not in op.data() and "fwd_saved_schema" not in op.data()
    cpp = render_files(plain)["torch-ext/torch_binding.cpp"]
    assert "fwd_saved" not in cpp and "kSaved" not in cpp


def test_the_binding_allocates_them_and_the_autograd_saves_them(pkg):
    cpp = render_files(pkg)["torch-ext/torch_binding.cpp"]
    ns = pkg.namespace
    assert "cuda_fwd_saved(const at::Tensor& a_logits, const at::Tensor& a_target)" in cpp
    assert "at::Tensor sv_saved_lse = allocate(kSaved[0], call.dims, output_dtype(kSaved[0], call), device);" in cpp
    assert "args.saved_lse = to_arg(sv_saved_lse);" in cpp  # the forward kernel writes it
    assert "args.saved_lse = to_arg(svin_saved_lse);" in cpp  # the backward kernel reads it
    assert 'm.impl("cross_entropy_lse_fwd_saved", TORCH_FN(op_cross_entropy_lse::cuda_fwd_saved));' in cpp
    assert f'findSchemaOrThrow("{ns}::cross_entropy_lse_fwd_saved", "")' in cpp
    assert "ctx->save_for_backward({a_logits, a_target, outs[0], outs[1]});" in cpp
    assert "outs.resize(1);  // the saved values stay hidden" in cpp


@pytest.mark.slow
def test_the_binding_compiles_against_the_installed_torch(pkg, tmp_path):
    from package_support import binding_syntax_errors

    root = emit_package(pkg, tmp_path / "sgsaved")
    assert binding_syntax_errors(root, [op.name for op in pkg.ops]) == ""


@pytest.fixture(scope="module")
def module(pkg, tmp_path_factory):
    """The emitted tree imported as it is (no _C: the Python path, the CPU reference)."""
    root = emit_package(pkg, tmp_path_factory.mktemp("tree") / "sgsaved")
    with pytest.warns(UserWarning, match="NOT verified"):  # no provenance: as if built with --no-verify
        mod = import_tree(root, "sgsaved")
    assert not mod.CUDA_KERNELS_LOADED
    return mod


def _ops(module):
    return getattr(torch.ops, module._ops.NAMESPACE)


def test_fwd_saved_returns_the_outputs_and_the_definitions_on_the_cpu(module):
    ops = _ops(module)
    logits, target = torch.randn(6, 11, dtype=torch.bfloat16), torch.randint(0, 11, (6,))
    out, lse = ops.cross_entropy_lse_fwd_saved(logits, target)
    assert torch.equal(out, ops.cross_entropy_lse(logits, target))
    assert lse.dtype == torch.float32 and lse.shape == (6,)
    assert torch.equal(lse, torch.logsumexp(logits.float(), dim=-1))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = ops.cross_entropy_lse_fwd_saved(mode.from_tensor(logits), mode.from_tensor(target))
    assert [(t.shape, t.dtype) for t in fake] == [((), torch.float32), ((6,), torch.float32)]


def test_autograd_hands_the_saved_values_to_the_backward_op(module):
    ops = _ops(module)
    x = torch.randn(5, 13, requires_grad=True)
    w = torch.randn(13, requires_grad=True)
    out = ops.rmsnorm_rstd(x, w, 1e-6)
    grad = torch.randn_like(out)
    gx, gw = torch.autograd.grad(out, (x, w), grad)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    ref = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
    ex, ew = torch.autograd.grad(ref, (xr, wr), grad)
    assert torch.allclose(gx, ex, atol=1e-5) and torch.allclose(gw, ew, atol=1e-5)
    # the backward op's schema takes the saved value after the output
    rstd = ops.rmsnorm_rstd_fwd_saved(x.detach(), w.detach(), 1e-6)[1]
    direct = ops.rmsnorm_rstd_backward(x.detach(), w.detach(), 1e-6, out.detach(), rstd, grad)
    assert torch.allclose(direct[0], ex, atol=1e-5) and torch.allclose(direct[1], ew, atol=1e-5)


@pytest.mark.slow
def test_the_generated_cpu_tests_pass_from_the_tree(pkg, tmp_path):
    """The package's own tests (opcheck of the public op with its Python autograd through
    <op>_fwd_saved, fake kernels of the backward with its saved arguments, torch.compile
    fullgraph forward and backward) on the CPU path of the emitted tree."""
    from package_support import run_generated_tests

    root = emit_package(pkg, tmp_path / "sgsaved")
    result = run_generated_tests(root, "sgsaved", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


def test_an_op_named_like_another_ops_fwd_saved_is_refused(specs, tmp_path):
    from specgen.errors import UsageError

    text = (SAVED / "rmsnorm_rstd.yaml").read_text().replace("rmsnorm_rstd", "cross_entropy_lse_fwd_saved")
    (tmp_path / "clash.yaml").write_text(text)
    with pytest.raises(UsageError, match="'cross_entropy_lse_fwd_saved' collides"):
        package_model("sgclash", [specs[0], load_spec(tmp_path / "clash.yaml")], {})


CPU_PROBE = """
import sys, warnings, torch
warnings.simplefilter("ignore")
import sgsaved
from sgsaved import _ops
ops = getattr(torch.ops, _ops.NAMESPACE)
dump = torch._C._dispatch_dump(_ops.NAMESPACE + "::rmsnorm_rstd")
print("loaded=" + str(sgsaved.CUDA_KERNELS_LOADED))
print("autograd=" + ("cpp" if "Autograd[alias]: registered at ./torch-ext/torch_binding.cpp" in dump else dump))
x, w = torch.randn(5, 13, requires_grad=True), torch.randn(13, requires_grad=True)
out = ops.rmsnorm_rstd(x, w, 1e-6)
g = torch.randn_like(out)
gx, gw = torch.autograd.grad(out, (x, w), g)
xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
ex, ew = torch.autograd.grad(xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr, (xr, wr), g)
print("grad=" + str(torch.allclose(gx, ex, atol=1e-5) and torch.allclose(gw, ew, atol=1e-5)))
"""


def _install(pkg, tmp_path) -> dict:
    """Build the wheel of `pkg` (nvcc compiles the kernels; no GPU needed), install it in a fresh
    folder: the environment that imports it."""
    import os

    from specgen.package import build_wheel

    root = emit_package(pkg, tmp_path / "sgsaved")
    wheel = build_wheel(root, tmp_path / "dist")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True)
    return dict(os.environ, PYTHONPATH=str(site))


def _generated_tests(env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                           "sgsaved.tests"], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.nvcc
@pytest.mark.slow
def test_the_binding_s_autograd_hands_the_saved_values_to_the_backward_on_the_cpu(pkg, tmp_path):
    """The compiled binding's C++ Autograd kernel (the one CUDA calls take) also takes CPU
    tensors: <op>_fwd_saved below autograd (the CPU reference and definitions), the saved values
    kept, <op>_backward called with them. No GPU needed; the wheel is built and loaded."""
    env = _install(pkg, tmp_path)
    probe = subprocess.run([sys.executable, "-c", CPU_PROBE], cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=600)
    if "loaded=False" in probe.stdout:
        pytest.skip("the compiled binding does not load here (a torch without CUDA)")
    assert probe.stdout.split() == ["loaded=True", "autograd=cpp", "grad=True"], probe.stdout + probe.stderr[-2000:]
    tests = _generated_tests(env, tmp_path)  # opcheck and torch.compile through the C++ autograd
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]


SAVED_PROBE = """
import sys, torch
import sgsaved
from sgsaved import _ops
ops = getattr(torch.ops, _ops.NAMESPACE)
print("loaded=" + str(sgsaved.CUDA_KERNELS_LOADED))
logits = torch.randn(64, 1000, device="cuda", requires_grad=True)
target = torch.randint(0, 1000, (64,), device="cuda")
out, lse = ops.cross_entropy_lse_fwd_saved(logits.detach(), target)
print("lse=" + str(torch.allclose(lse, torch.logsumexp(logits.detach(), -1), atol=1e-5, rtol=1e-5)))
loss = ops.cross_entropy_lse(logits, target)  # the Autograd kernel: the forward kernel writes lse
loss.backward()
want = torch.func.grad(lambda x: torch.nn.functional.cross_entropy(x, target))(logits.detach())
print("grad=" + str(torch.allclose(logits.grad, want, atol=1e-6, rtol=1e-4)))
# the backward kernel reads lse: a wrong lse gives a wrong gradient (it is not recomputed)
g = ops.cross_entropy_lse_backward(logits.detach(), target, out, lse + 1.0, torch.ones((), device="cuda"))
print("reads_lse=" + str(not torch.allclose(g, want, atol=1e-6, rtol=1e-4)))
with torch.no_grad():  # inference: below autograd, the saved values are written and dropped
    print("inference=" + str(torch.allclose(ops.cross_entropy_lse(logits, target), out)))
"""


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.slow
def test_the_wheel_with_saved_values_runs_its_kernels_and_passes_its_tests(pkg, tmp_path):
    import dataclasses

    env = _install(dataclasses.replace(pkg, arch_list="9.0+PTX"), tmp_path)
    tests = _generated_tests(env, tmp_path)  # on a GPU: its CUDA tests too (the kernels against float64)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    probe = subprocess.run([sys.executable, "-c", SAVED_PROBE], cwd=tmp_path, capture_output=True, text=True,
                           env=env, timeout=600)
    assert probe.stdout.split() == ["loaded=True", "lse=True", "grad=True", "reads_lse=True", "inference=True"], \
        probe.stdout + probe.stderr[-2000:]
