"""Inputs without a gradient (`no_grad: [cos, sin]`, issue 13): the backward computes no gradient
for them, from the spec through the ABI, the generator, the verifier's backward cases and the
package's autograd, which refuses a call that asks for one (docs/ARCHITECTURE.md "Inputs without
a gradient")."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from builtin_support import check_backward
from package_support import import_tree, run_generated_tests
from specgen import abi
from specgen.agents.builtin.generator import build_source
from specgen.errors import SpecError
from specgen.package.emit import emit_package, render_files
from specgen.package.model import package_model
from specgen.spec import load_spec
from specgen.verify.data import prepare
from specgen.verify.strategies import make_case

HERE = Path(__file__).resolve().parent
TABLES = HERE / "no_grad_specs" / "rope_tables.yaml"


@pytest.fixture(scope="module")
def spec():
    return load_spec(TABLES)


def _without_no_grad(tmp_path: Path) -> Path:
    path = tmp_path / "rope_tables.yaml"
    path.write_text("".join(line for line in TABLES.read_text().splitlines(True) if not line.startswith("no_grad:")))
    return path


def test_the_backward_abi_has_gradients_only_for_the_other_inputs(spec, tmp_path):
    assert abi.grad_input_names(spec) == ["grad_x"]
    header = abi.header_text(spec)
    assert "specgen_tensor grad_x;" in header and "grad_cos" not in header and "grad_sin" not in header
    full = load_spec(_without_no_grad(tmp_path))
    assert abi.grad_input_names(full) == ["grad_x", "grad_cos", "grad_sin"]
    # the list is part of what the lock's hash covers; a spec without it hashes as before
    assert spec.hash() != full.hash() and "no_grad" not in full.canonical()
    assert spec.canonical()["no_grad"] == ["cos", "sin"]
    assert str(spec.signature) == str(full.signature)  # the signature's text is unchanged


@pytest.mark.parametrize("text, message", [
    ("no_grad: [cos, cos]", "'cos' is listed twice"),
    ("no_grad: [coss]", "no_grad: 'coss' is not a tensor input"),
    ("no_grad: [x, cos, sin]", "backward: kernel needs a floating input to differentiate (every floating input is in "
                               "no_grad)"),
])
def test_a_bad_no_grad_list_names_its_line(tmp_path, text, message):
    path = tmp_path / "rope_tables.yaml"
    lines = TABLES.read_text().splitlines(True)
    path.write_text("".join(text + "\n" if line.startswith("no_grad:") else line for line in lines))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert message in str(caught.value)
    line = next(i for i, line in enumerate(lines, 1) if line.startswith("no_grad:" if "x, cos" not in text
                                                                          else "backward:"))
    assert f"rope_tables.yaml:{line}" in str(caught.value)


def test_no_grad_without_a_backward_is_refused(tmp_path):
    path = tmp_path / "rope_tables.yaml"
    path.write_text(TABLES.read_text().replace("backward: kernel", "backward: none"))
    with pytest.raises(SpecError, match="no_grad is given but the op has no backward"):
        load_spec(path)


def test_the_generated_backward_writes_only_the_wanted_gradient_and_matches_autograd(spec):
    check_backward(spec, {"S": 3, "H": 2, "D": 8})
    source = build_source(spec)
    assert "grad_cos" not in source and "finalize_cols" not in source  # no column reduction over the heads


def test_the_verifier_checks_only_the_wanted_gradient(spec):
    data = prepare(spec, make_case({"S": 3, "H": 2, "D": 8}, "float32", seed=1), "backward", "cpu")
    assert [s.name for s in data.outputs] == ["grad_x"]
    assert set(data.truth) == {"grad_x"}


# ---------------------------------------------------------------- the package

@pytest.fixture(scope="module")
def pkg(spec):
    return package_model("sgnograd", [spec], {spec.name: build_source(spec)}, arch_list="9.0")


def test_the_package_declares_one_input_gradient_and_refuses_the_others_in_cpp(pkg):
    op = pkg.ops[0]
    assert [t.name for t in op.grad_inputs] == ["x"] and [t.name for t in op.no_grad_inputs] == ["cos", "sin"]
    assert op.backward_schema.endswith("-> Tensor")  # one gradient
    assert op.cpp_grad_slots("found") == "found[0], at::Tensor(), at::Tensor()"
    cpp = render_files(pkg)["torch-ext/torch_binding.cpp"]
    assert re.search(r'TORCH_CHECK\(!\(at::GradMode::is_enabled\(\) && a_sin\.requires_grad\(\)\), '
                     r'"sgnograd_\w+\.rope_tables: sin requires grad, but the op\'s spec lists it in no_grad', cpp)


@pytest.fixture(scope="module")
def module(pkg, tmp_path_factory):
    root = emit_package(pkg, tmp_path_factory.mktemp("tree") / "sgnograd")
    with pytest.warns(UserWarning, match="NOT verified"):
        return import_tree(root, "sgnograd")


def _inputs(requires_grad_tables: bool):
    x = torch.randn(3, 2, 8, dtype=torch.float32, requires_grad=True)
    cos, sin = torch.randn(3, 4), torch.randn(3, 4)
    return x, cos.requires_grad_(requires_grad_tables), sin


def test_the_python_autograd_gives_x_its_gradient(module, spec):
    x, cos, sin = _inputs(False)
    (grad_x,) = torch.autograd.grad(module.rope_tables(x, cos, sin).sum(), [x])
    want, = torch.autograd.grad(spec.reference_fn()(x, cos, sin).sum(), [x])
    torch.testing.assert_close(grad_x, want)


def test_asking_for_a_tables_gradient_is_a_clear_error(module):
    x, cos, sin = _inputs(True)
    with pytest.raises(RuntimeError, match=r"rope_tables: cos requires grad, but the op's spec lists it in no_grad .*"
                                           r"pass cos\.detach\(\)"):
        module.rope_tables(x, cos, sin)
    with torch.no_grad():  # no graph is built: nothing is asked
        module.rope_tables(x, cos, sin)


@pytest.mark.slow
def test_the_no_grad_binding_compiles_against_the_installed_torch(pkg, tmp_path):
    from package_support import binding_syntax_errors

    root = emit_package(pkg, tmp_path / "sgnograd")
    assert binding_syntax_errors(root, [op.name for op in pkg.ops if op.has_kernel]) == ""


@pytest.mark.slow
def test_the_generated_cpu_tests_pass_from_the_tree(pkg, tmp_path):
    """The package's own tests for the op, on the CPU path of the emitted tree: the refusal, the
    fake backward's one gradient, autograd against the reference."""
    root = emit_package(pkg, tmp_path / "sgnograd")
    result = run_generated_tests(root, "sgnograd", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for test in ("test_an_input_without_a_gradient_is_refused_when_it_requires_grad_cpu[rope_tables]",
                 "test_backward_op_fake_kernel_matches_the_real_one[rope_tables]"):
        assert re.search(rf"PASSED \S*tests/test_ops\.py::{re.escape(test)}", result.stdout), test
