"""Leading batch dims (issue 13) in the package: the public op `<op>` of a spec with
`x: Tensor[*B, D]` is a CompositeImplicitAutograd kernel over `<op>_rows` (the op on [B, D]) that
folds the leading dims into B and restores them (docs/ARCHITECTURE.md "Leading batch dims")."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from package_support import import_tree, run_generated_tests
from specgen.agents.builtin.generator import build_source
from specgen.errors import UsageError
from specgen.package.emit import emit_package, render_files
from specgen.package.model import package_model
from specgen.spec import load_spec

BATCH = Path(__file__).resolve().parent / "batch_specs"
SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.fixture(scope="module")
def batched():
    return load_spec(BATCH / "rmsnorm_batched.yaml")


# ---------------------------------------------------------------- the package

@pytest.fixture(scope="module")
def pkg(batched):
    return package_model("sgbatch", [batched, load_spec(SPECS / "bias_gelu.yaml")], {batched.name: build_source(batched)},
                         arch_list="9.0")


def test_the_public_op_keeps_its_schema_and_the_inner_op_takes_the_registrations(pkg):
    op = pkg.ops[0]
    assert op.schema == "(Tensor x, Tensor weight, float eps=1e-06) -> Tensor"  # as specs/rmsnorm.yaml's
    assert (op.batch, op.rows_name, op.fwd_saved_name, op.backward_name) == (
        "B", "rmsnorm_batched_rows", "rmsnorm_batched_fwd_saved", "rmsnorm_batched_backward")
    assert [t.name for t in op.batched_inputs] == ["x"]
    assert op.data()["batch"] == "B" and op.data()["rows"] == "rmsnorm_batched_rows"
    plain = pkg.ops[1]
    assert plain.rows_name == "bias_gelu" and "batch" not in plain.data() and "rows" not in plain.data()
    cpp = render_files(pkg)["torch-ext/torch_binding.cpp"]
    ns = pkg.namespace
    assert 'm.impl("rmsnorm_batched_rows", TORCH_FN(op_rmsnorm_batched::cuda_forward));' in cpp
    assert 'm.impl("rmsnorm_batched", TORCH_FN(op_rmsnorm_batched::cuda_forward));' not in cpp
    assert 'm.impl("rmsnorm_batched_fwd_saved", TORCH_FN(op_rmsnorm_batched::cuda_fwd_saved));' in cpp
    assert 'm.impl("rmsnorm_batched_rows", TORCH_FN(op_rmsnorm_batched::autograd_forward));' in cpp
    assert f"TORCH_LIBRARY_IMPL({ns}, CompositeImplicitAutograd, m)" in cpp
    assert 'm.impl("rmsnorm_batched", TORCH_FN(op_rmsnorm_batched::batched_forward));' in cpp
    assert f'.findSchemaOrThrow("{ns}::rmsnorm_batched_rows", "")' in cpp
    assert "fold_batch(a_x, 1, " in cpp and "fold_batch(a_weight" not in cpp
    init = render_files(pkg)["torch-ext/sgbatch/__init__.py"]
    assert "        x: [*B, D]\n        weight: [D]\n        returns out: [*B, D]\n" in init  # the docstring


def test_a_package_without_a_batch_group_renders_no_composite():
    plain = package_model("sgplain", [load_spec(SPECS / "bias_gelu.yaml")], {}, arch_list="9.0")
    files = render_files(plain)
    assert "CompositeImplicitAutograd" not in files.get("torch-ext/torch_binding.cpp", "")


def test_an_op_named_like_another_ops_rows_op_is_refused(batched, tmp_path):
    text = (SPECS / "bias_gelu.yaml").read_text().replace("bias_gelu", "rmsnorm_batched_rows")
    (tmp_path / "rmsnorm_batched_rows.yaml").write_text(text)
    other = load_spec(tmp_path / "rmsnorm_batched_rows.yaml")
    with pytest.raises(UsageError, match="'rmsnorm_batched_rows' collides with the internal op that runs "
                                         "'rmsnorm_batched' on its batch group"):
        package_model("sgbad", [batched, other], {}, arch_list="9.0")


@pytest.fixture(scope="module")
def module(pkg, tmp_path_factory):
    """The emitted tree imported as it is (no _C: the Python composite and the CPU reference)."""
    root = emit_package(pkg, tmp_path_factory.mktemp("tree") / "sgbatch")
    with pytest.warns(UserWarning, match="NOT verified"):  # no provenance: as if built with --no-verify
        mod = import_tree(root, "sgbatch")
    assert not mod.CUDA_KERNELS_LOADED
    return mod


def _ops(module):
    return getattr(torch.ops, module._ops.NAMESPACE)


def _reference(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_the_registered_schema_of_the_public_op_is_unchanged(module):
    ops, ns = _ops(module), module._ops.NAMESPACE
    for name in ("rmsnorm_batched", "rmsnorm_batched_rows"):
        want = torch._C.parse_schema(f"{ns}::{name}(Tensor x, Tensor weight, float eps=1e-06) -> Tensor")
        assert str(getattr(ops, name).default._schema) == str(want)


@pytest.mark.parametrize("shape", [(2, 3, 16), (5, 16), (16,), (2, 1, 3, 16), (0, 4, 16)])
def test_any_leading_dims_give_the_reference_of_the_folded_rows(module, shape):
    x, w = torch.randn(shape), torch.randn(16)
    out = module.rmsnorm_batched(x, w)
    assert out.shape == x.shape
    rows = _ops(module).rmsnorm_batched_rows(x.reshape(-1, 16), w, 1e-6)
    assert torch.equal(out, rows.reshape(shape))
    assert torch.allclose(out, _reference(x, w), atol=1e-5)


def test_a_batched_input_with_too_few_dims_is_a_clear_error(module):
    with pytest.raises(RuntimeError, match=r"rmsnorm_batched: x must have at least 1 dims \(\*B then \[D\]\), "
                                           r"got shape \(\)"):
        module.rmsnorm_batched(torch.tensor(1.0), torch.randn(1))


def test_the_inner_op_checks_the_rest_of_the_shape(module):
    with pytest.raises(RuntimeError, match=r"rmsnorm_batched_rows: weight axis 0 is 8"):
        module.rmsnorm_batched(torch.randn(2, 3, 16), torch.randn(8))


def test_autograd_through_the_public_op_matches_the_references(module):
    x = torch.randn(2, 3, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    out = module.rmsnorm_batched(x, w)
    grad = torch.randn_like(out)
    gx, gw = torch.autograd.grad(out, (x, w), grad)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    ex, ew = torch.autograd.grad(_reference(xr, wr), (xr, wr), grad)
    assert gx.shape == x.shape
    assert torch.allclose(gx, ex, atol=1e-5) and torch.allclose(gw, ew, atol=1e-5)


def test_torch_compile_runs_the_public_op_on_leading_dims(module):
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w: module.rmsnorm_batched(x, w) * 2, backend="aot_eager", fullgraph=True)
    x, w = torch.randn(2, 3, 16), torch.randn(16)
    assert torch.allclose(fn(x, w), 2 * _reference(x, w), atol=1e-5)
    x2 = torch.randn(4, 5, 16)  # other leading dims: a recompile or a dynamic graph, either way right
    assert torch.allclose(fn(x2, w), 2 * _reference(x2, w), atol=1e-5)


def test_fake_tensors_get_the_leading_dims_back(module):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        out = module.rmsnorm_batched(mode.from_tensor(torch.randn(2, 3, 16)), mode.from_tensor(torch.randn(16)))
    assert out.shape == (2, 3, 16)


def test_a_layer_folds_leading_dims_before_a_batched_op_as_before(module):
    from specgen.package.layer_runtime import call

    x, w = torch.randn(2, 3, 16), torch.randn(16)
    op = module._ops.OPS["rmsnorm_batched"]
    out = call(module.rmsnorm_batched, op, {"x": x, "weight": w, "eps": 1e-6}, single=True)
    assert out.shape == x.shape and torch.equal(out, module.rmsnorm_batched(x, w))


# ---------------------------------------------------------------- two batched inputs

@pytest.fixture(scope="module")
def pair_module(tmp_path_factory):
    """An op with two batched inputs and a batched output, no kernel (the reference everywhere)."""
    folder = tmp_path_factory.mktemp("pair")
    pkg = package_model("sgpair", [load_spec(BATCH / "add_batched.yaml")], {}, arch_list="9.0")
    return import_tree(emit_package(pkg, folder / "sgpair"), "sgpair")


def test_two_batched_inputs_must_agree_on_the_leading_dims(pair_module):
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    out, total = pair_module.add_batched(x, y)
    assert torch.equal(out, x + y) and total.shape == () and torch.allclose(total, (x + y).sum())
    with pytest.raises(RuntimeError, match=r"add_batched: y has leading dims \[6\] \(shape \(6, 4\)\) but x has "
                                           r"\[2, 3\] \(shape \(2, 3, 4\)\); the batch group \*B must be the same"):
        pair_module.add_batched(x, y.reshape(6, 4))


def test_two_batched_inputs_differentiate_through_the_composite(pair_module):
    x = torch.randn(2, 3, 4, requires_grad=True)
    y = torch.randn(2, 3, 4, requires_grad=True)
    out, total = pair_module.add_batched(x, y)
    gx, gy = torch.autograd.grad(total + (out * 2).sum(), (x, y))
    assert torch.allclose(gx, torch.full_like(x, 3.0)) and torch.allclose(gy, torch.full_like(y, 3.0))


# ---------------------------------------------------------------- the binding's C++ composite

@pytest.mark.slow
def test_the_batched_binding_compiles_against_the_installed_torch(pkg, tmp_path):
    from package_support import binding_syntax_errors

    root = emit_package(pkg, tmp_path / "sgbatch")
    assert binding_syntax_errors(root, [op.name for op in pkg.ops if op.has_kernel]) == ""


@pytest.mark.slow
def test_the_generated_cpu_tests_pass_from_the_tree(batched, tmp_path):
    """The package's own tests (opcheck, fake kernels, torch.compile, wrong ranks, the leading
    dims against the inner op) with both batched specs, on the CPU path of the emitted tree."""
    specs = [batched, load_spec(BATCH / "add_batched.yaml")]
    pkg = package_model("sgbatchtests", specs, {batched.name: build_source(batched)}, arch_list="9.0")
    root = emit_package(pkg, tmp_path / "sgbatchtests")
    result = run_generated_tests(root, "sgbatchtests", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for test in ("test_leading_dims_fold_into_the_inner_op_cpu[rmsnorm_batched]",
                 "test_leading_dims_fold_into_the_inner_op_cpu[add_batched]",
                 "test_wrong_rank_is_a_clear_error[add_batched]", "test_compile_fullgraph_cpu[rmsnorm_batched]"):
        assert re.search(rf"PASSED \S*tests/test_ops\.py::{re.escape(test)}", result.stdout), test


@pytest.mark.parametrize("name", ["rmsnorm", "add_rmsnorm", "softmax", "log_softmax", "gelu_tanh", "swiglu"])
def test_the_example_ops_that_models_call_on_batch_seq_hidden_take_leading_dims(name):
    """The example specs write their row axis as a batch group (`*N`): the public op folds the
    leading dims (issue 13: `rmsnorm(x[2, 8, 64], w)` raised "x must be 2-d")."""
    spec = load_spec(SPECS / f"{name}.yaml")
    op = package_model("sgexamples", [spec], {}, arch_list="9.0").ops[0]
    assert (op.batch, op.rows_name) == ("N", f"{name}_rows")
    assert [t.name for t in op.batched_inputs] == (["x", "residual"] if name == "add_rmsnorm" else ["x"])
