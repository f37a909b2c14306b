"""The package's Python runtime (specgen/package/ops_runtime.py, emitted verbatim as <package>/_ops.py)
imported directly, not through a built package: its pure functions on op data built from real
specs by model.py, as `_spec_data.OPS` holds it, and the per-package data that replaced the
template tags. Imported here, the module registers nothing (no `_spec_data` beside it)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from package_support import unbatched_spec
from specgen.package import ops_runtime as rt
from specgen.package.emit import render_files
from specgen.package.model import package_model
from specgen.reference import load_reference

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"
SAVED = Path(__file__).resolve().parent / "saved_specs"


def _spec(name):
    """The plain op (a batch group `*N` written `N`): these tests check the messages of the op that
    runs; a batched op's run under `<op>_rows` (tests/test_batch_package.py)."""
    folder = SAVED if (SAVED / f"{name}.yaml").exists() else SPECS
    return unbatched_spec(folder / f"{name}.yaml")


def _op(name):
    """The op's dict exactly as the package's _spec_data.OPS holds it (OpModel.data())."""
    return package_model("sgruntime", [_spec(name)], {}).ops[0].data()


@pytest.fixture(scope="module")
def rmsnorm():
    return _op("rmsnorm")


@pytest.fixture(scope="module")
def cross_entropy():
    return _op("cross_entropy")


# ---------------------------------------------------------------- the module itself

def test_imported_from_specgen_it_registers_nothing():
    assert rt.NAMESPACE is None and rt.LIB is None and rt.OPS == {}
    assert rt.CUDA_KERNELS_LOADED is False and rt.CUDA_KERNELS_ERROR is None
    rt.check_device_contracts()  # no package data: nothing is checked, nothing raised
    assert rt._where({"name": "rmsnorm"}, "_backward") == "rmsnorm_backward"


def test_every_package_gets_the_same_file_and_its_own_data():
    kernel = (SPECS / "kernels" / "cross_entropy.cu").read_text()
    with_kernel = package_model("sgkernel", [_spec("cross_entropy"), _spec("swiglu")], {"cross_entropy": kernel},
                                arch_list="9.0")  # no provenance: as if built with --no-verify
    plain = package_model("sgplain", [_spec("rmsnorm")], {})
    source = Path(rt.__file__).read_text()
    found = {}
    for pkg in (with_kernel, plain):
        files = render_files(pkg)
        assert files[f"torch-ext/{pkg.name}/_ops.py"] == source
        assert "{%" not in source and "{{" not in source
        data = {}
        exec(files[f"torch-ext/{pkg.name}/_spec_data.py"], data)
        found[pkg.name] = (data["HAS_KERNELS"], data["UNVERIFIED_OPS"], data["RANGE_SITES"])
    assert found["sgkernel"] == (True, ["cross_entropy"], [("cross_entropy", "target")])
    assert found["sgplain"] == (False, [], [])


# ---------------------------------------------------------------- arguments

def test_split_args_fills_trailing_defaults_and_join_args_restores_the_order(rmsnorm):
    x, w = torch.randn(4, 8), torch.randn(8)
    tensors, scalars = rt.split_args(rmsnorm, (x, w))
    assert list(tensors) == ["x", "weight"] and tensors["x"] is x and tensors["weight"] is w
    assert scalars == [1e-6]  # the spec's default
    tensors, scalars = rt.split_args(rmsnorm, [x, w, 0.5])
    assert scalars == [0.5]
    joined = rt.join_args(rmsnorm, tensors, scalars)
    assert joined[0] is x and joined[1] is w and joined[2] == 0.5


def test_split_backward_args_skips_the_saved_values():
    op = _op("rmsnorm_rstd")  # backward: (x, weight, eps, out, saved_rstd, grad_out)
    assert [s["name"] for s in op["saved"]] == ["saved_rstd"]
    x, w, out, rstd, grad = torch.randn(4, 8), torch.randn(8), torch.randn(4, 8), torch.randn(4), torch.randn(4, 8)
    tensors, scalars, outs, grads = rt._split_backward_args(op, (x, w, 1e-5, out, rstd, grad))
    assert list(tensors) == ["x", "weight"] and tensors["x"] is x and tensors["weight"] is w
    assert scalars == [1e-5]
    assert len(outs) == 1 and outs[0] is out
    assert len(grads) == 1 and grads[0] is grad  # not the saved rstd


def test_split_backward_args_without_saved_values():
    softmax = _op("softmax")  # backward: (x, out, grad_out)
    x, out, grad = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    tensors, scalars, outs, grads = rt._split_backward_args(softmax, (x, out, grad))
    assert tensors == {"x": x} and scalars == []
    assert outs[0] is out and grads[0] is grad


# ---------------------------------------------------------------- shapes and dtypes

def test_check_call_resolves_the_symbols_and_the_working_dtype(rmsnorm):
    dims, working = rt.check_call(rmsnorm, {"x": torch.randn(4, 8, dtype=torch.float16),
                                            "weight": torch.randn(8, dtype=torch.float16)})
    assert dims == {"N": 4, "D": 8} and working == torch.float16


def test_a_scaled_symbol_is_read_back_and_an_odd_size_refused():
    swiglu = _op("swiglu")  # x: [N, 2*H]
    assert rt.resolve_dims(swiglu, {"x": torch.randn(3, 10)}) == {"N": 3, "H": 5}
    with pytest.raises(RuntimeError, match=r"swiglu: x axis 1 \(9\) gives no whole H \(signature: swiglu\("):
        rt.resolve_dims(swiglu, {"x": torch.randn(3, 9)})


def test_shape_errors_name_the_argument_the_axis_and_the_signature(rmsnorm):
    with pytest.raises(RuntimeError, match=r"^rmsnorm: weight axis 0 is 7 but the other arguments make it 8 "
                                           r"\(signature: rmsnorm\(x: Tensor\[N, D\]"):
        rt.check_call(rmsnorm, {"x": torch.randn(4, 8), "weight": torch.randn(7)})
    with pytest.raises(RuntimeError, match=r"rmsnorm: x must be 2-d \[N, D\], got shape \(8,\)"):
        rt.check_call(rmsnorm, {"x": torch.randn(8), "weight": torch.randn(8)})
    with pytest.raises(TypeError, match="rmsnorm: weight must be a torch.Tensor, got list"):
        rt.check_call(rmsnorm, {"x": torch.randn(4, 8), "weight": [1.0] * 8})
    with pytest.raises(RuntimeError, match=r"^pkg\.rmsnorm_backward: weight axis 0"):  # `where` names the caller
        rt.check_call(rmsnorm, {"x": torch.randn(4, 8), "weight": torch.randn(7)}, "pkg.rmsnorm_backward")


def test_dtype_errors(rmsnorm, cross_entropy):
    with pytest.raises(RuntimeError, match="rmsnorm: x is float64; supported dtypes: float32, float16, bfloat16"):
        rt.check_dtypes(rmsnorm, {"x": torch.randn(4, 8, dtype=torch.float64), "weight": torch.randn(8)})
    with pytest.raises(RuntimeError, match="rmsnorm: weight is bfloat16 but x is float32; floating arguments "
                                           "share one dtype"):
        rt.check_dtypes(rmsnorm, {"x": torch.randn(4, 8), "weight": torch.randn(8, dtype=torch.bfloat16)})
    with pytest.raises(RuntimeError, match="cross_entropy: target must be int64, got int32"):
        rt.check_dtypes(cross_entropy, {"logits": torch.randn(3, 5), "target": torch.zeros(3, dtype=torch.int32)})
    assert rt.check_dtypes(cross_entropy, {"logits": torch.randn(3, 5, dtype=torch.bfloat16),
                                           "target": torch.zeros(3, dtype=torch.int64)}) == torch.bfloat16


def test_a_backward_gradient_of_the_wrong_shape_is_refused(rmsnorm):
    tensors = {"x": torch.randn(4, 8), "weight": torch.randn(8)}
    with pytest.raises(RuntimeError, match=r"pkg.rmsnorm_backward: grad_out has shape \(4, 7\), the output \(4, 8\)"):
        rt._check_backward(rmsnorm, tensors, [torch.randn(4, 8)], [torch.randn(4, 7)], "pkg.rmsnorm_backward")
    assert rt._check_backward(rmsnorm, tensors, [torch.randn(4, 8)], [torch.randn(4, 8)], "w") == (
        {"N": 4, "D": 8}, torch.float32)


def test_fake_kernels_give_the_declared_shapes_and_dtypes(cross_entropy):
    with FakeTensorMode():
        out = rt._fake_forward(cross_entropy)(torch.empty(6, 11, dtype=torch.float16),
                                              torch.empty(6, dtype=torch.int64))
        assert out.shape == () and out.dtype == torch.float32  # Tensor[] float32 whatever the working dtype
        # the values of a fake tensor are unknown: no range check
        rt.check_values(cross_entropy, {"logits": torch.empty(6, 11), "target": torch.empty(6, dtype=torch.int64)},
                        {"N": 6, "C": 11})


# ---------------------------------------------------------------- values on the reference path

def test_check_values_refuses_a_label_outside_its_declared_range(cross_entropy):
    logits = torch.randn(3, 5)
    for bad in (-100, 5):
        target = torch.tensor([0, bad, 4])
        with pytest.raises(RuntimeError, match=rf"^cross_entropy: target holds {bad}, outside \[0, 5\), the range its "
                                               r"signature declares; mask such entries"):
            rt.check_values(cross_entropy, {"logits": logits, "target": target}, {"N": 3, "C": 5})
    rt.check_values(cross_entropy, {"logits": logits, "target": torch.tensor([0, 2, 4])}, {"N": 3, "C": 5})
    rt.check_values(cross_entropy, {"logits": torch.randn(0, 5), "target": torch.zeros(0, dtype=torch.int64)},
                    {"N": 0, "C": 5})  # nothing to read


def test_the_reference_path_checks_the_range_and_returns_the_declared_output(cross_entropy):
    forward = rt._reference_forward(cross_entropy, load_reference(_spec("cross_entropy")))
    logits = torch.randn(4, 6, dtype=torch.bfloat16)
    out = forward(logits, torch.tensor([0, 5, 2, 3]))
    assert out.shape == () and out.dtype == torch.float32
    want = torch.nn.functional.cross_entropy(logits.float(), torch.tensor([0, 5, 2, 3]))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match=r"target holds -100, outside \[0, 6\)"):
        forward(logits, torch.tensor([0, -100, 2, 3]))
    with pytest.raises(RuntimeError, match="target must be int64, got float32"):
        forward(logits, torch.tensor([0.0, 1.0, 2.0, 3.0]))


def test_the_reference_backward_is_the_references_autograd(rmsnorm):
    fn = load_reference(_spec("rmsnorm"))
    x, w, grad = torch.randn(3, 8), torch.randn(8), torch.randn(3, 8)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)  # specs/rmsnorm.yaml saves it for the backward
    gx, gw = rt._reference_backward(rmsnorm, fn)(x, w, 1e-6, fn(x, w), rstd, grad)
    leaves = (x.clone().requires_grad_(), w.clone().requires_grad_())
    want = torch.autograd.grad(fn(*leaves, 1e-6), leaves, grad)
    torch.testing.assert_close((gx, gw), want)
    assert not gx.requires_grad and gx.is_contiguous()


def test_a_reference_returning_the_wrong_shape_is_an_error(rmsnorm):
    forward = rt._reference_forward(rmsnorm, lambda x, weight, eps: x[:, :4])
    with pytest.raises(RuntimeError, match=r"rmsnorm: the reference returned shape \(2, 4\), the signature says "
                                           r"\(2, 8\)"):
        forward(torch.randn(2, 8), torch.randn(8))


def test_an_output_that_is_an_input_is_copied(rmsnorm):
    x = torch.randn(2, 8)
    out = rt._reference_forward(rmsnorm, lambda x, weight, eps: x)(x, torch.randn(8))
    assert torch.equal(out, x) and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_arch_supported_with_an_explicit_table():
    assert rt.arch_supported((9, 0), [(8, 0, "", False), (9, 0, "", True)])
    assert not rt.arch_supported((9, 0), [])  # outside a package: no architectures
    assert not rt.arch_supported((9, 0))
