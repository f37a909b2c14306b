"""`specgen.spec_from` / `specgen import`: symbolic sizes, dtypes, ranges and flags from examples."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from specgen import spec_from
from specgen.checking import check_spec
from specgen.importing import ImportRefused
from specgen.signature import parse_signature


def rms_ref(x, weight, eps=1e-6):
    """RMSNorm with a learned scale."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def matmul(a, b):
    return a @ b


def cross_entropy_rows(logits, target):
    return F.cross_entropy(logits.float(), target, reduction="none").to(logits.dtype)


def add_codes(x, codes):
    return x + codes.unsqueeze(-1).to(x.dtype)


def half_gate(x, w):
    x1, x2 = x.chunk(2, dim=-1)
    return x1 * w + x2


def fixed_projection(x):
    return x @ torch.ones(64, 5, dtype=x.dtype)


def scale_rows(x, alpha: float = 2.0, square: bool = False):
    y = x * alpha
    return y * y if square else y


def checks(imported, tmp_path):
    path = tmp_path / f"{imported.name}.yaml"
    path.write_text(imported.text())
    result = check_spec(path)
    assert result.ok, str(result.error)
    return result.spec


def test_a_function_with_a_scalar_default_and_a_shared_size(tmp_path):
    imported = spec_from(rms_ref, [torch.randn(64, 32), torch.randn(32)])
    assert imported.signature == "rms_ref(x: Tensor[N, D], weight: Tensor[D], eps: float = 1e-06) -> Tensor[N, D]"
    assert imported.dims == {"N": (1, 64), "D": (1, 32)}
    assert imported.dtypes == ["float32", "float16", "bfloat16"]
    assert imported.benchmark == [{"N": 64, "D": 32}]
    assert imported.description == "RMSNorm with a learned scale."
    assert imported.backward == "kernel"
    merged = [f for f in imported.flags if f.startswith("D: x.shape[1] and weight.shape[0] were both 32")]
    assert merged and "share one symbol" in merged[0]
    spec = checks(imported, tmp_path)
    assert str(spec.signature) == imported.signature


def test_equal_sizes_are_flagged_and_kept_apart_when_the_reference_allows(tmp_path):
    imported = spec_from(matmul, [torch.randn(16, 16), torch.randn(16, 16)])
    assert imported.signature == "matmul(a: Tensor[N, D], b: Tensor[D, M]) -> Tensor[N, M]"
    text = " ".join(imported.flags)
    assert "were all 16 in the example inputs; the reference runs with them different" in text
    assert "a.shape[1] and b.shape[0] were both 16" in text and "confirm they must be equal" in text
    assert "#   - " in imported.text()  # the flags go into the file as comments
    checks(imported, tmp_path)


def test_an_integer_index_gets_the_size_it_indexes_as_its_range(tmp_path):
    imported = spec_from(cross_entropy_rows, [torch.randn(8, 10), torch.randint(0, 10, (8,))])
    assert imported.signature == ("cross_entropy_rows(logits: Tensor[N, D], target: Tensor[N] int64 in [0, D)) "
                                  "-> Tensor[N]")
    checks(imported, tmp_path)


def test_an_integer_input_no_size_bounds_falls_back_to_its_example_values_and_is_flagged(tmp_path):
    codes = torch.tensor([3, -2, 5, 1, 0, 4, -2, 1])  # the reference takes any value: no size bounds them
    imported = spec_from(add_codes, [torch.randn(8, 10), codes])
    assert imported.signature == "add_codes(x: Tensor[N, D], codes: Tensor[N] int64 in [-2, 6)) -> Tensor[N, D]"
    assert ("codes: integer values [-2, 5] in the example; no size bounds them in the reference, so the range "
            "is [-2, 6): widen it if larger values are valid") in imported.flags
    checks(imported, tmp_path)


def test_a_size_tied_by_a_ratio_becomes_s_over_k(tmp_path):
    imported = spec_from(half_gate, [torch.randn(4, 16), torch.randn(8)])
    assert imported.signature == "half_gate(x: Tensor[N, D], w: Tensor[D/2]) -> Tensor[N, D/2]"
    assert any("keeps that ratio" in f for f in imported.flags)
    checks(imported, tmp_path)


def test_a_size_the_reference_needs_is_a_literal_and_flagged(tmp_path):
    imported = spec_from(fixed_projection, [torch.randn(10, 64)])
    assert imported.signature == "fixed_projection(x: Tensor[N, 64]) -> Tensor[N, 5]"
    assert any(f.startswith("x.shape[1] is fixed at 64") for f in imported.flags)
    checks(imported, tmp_path)


def test_scalars_take_their_examples_as_defaults_and_bools_stay_bools(tmp_path):
    imported = spec_from(scale_rows, {"x": torch.randn(6, 3), "alpha": 0.5, "square": True})
    assert imported.signature == ("scale_rows(x: Tensor[N, D], alpha: float = 0.5, square: bool = True) "
                                  "-> Tensor[N, D]")
    assert any(f.startswith("alpha: its default 0.5 is the example's value") for f in imported.flags)
    checks(imported, tmp_path)


class ScaleShift(torch.nn.Module):
    """Scale and shift per feature."""

    def __init__(self, size):
        super().__init__()
        self.affine = torch.nn.ParameterDict({"scale": torch.nn.Parameter(torch.ones(size))})
        self.register_buffer("shift", torch.zeros(size))

    def forward(self, x):
        return x * self.affine["scale"] + self.shift


def test_a_module_class_parameters_and_buffers_become_inputs(tmp_path):
    imported = spec_from(ScaleShift, [torch.randn(12, 48)], init_inputs=[48], reference="inline")
    assert imported.signature == ("scale_shift(x: Tensor[N, D], affine_scale: Tensor[D], shift: Tensor[D]) "
                                  "-> Tensor[N, D]")
    assert any("parameters and buffers are inputs of the spec (affine_scale, shift)" in f for f in imported.flags)
    spec = checks(imported, tmp_path)
    out = spec.reference_fn()(x=torch.ones(2, 3), affine_scale=torch.full((3,), 2.0), shift=torch.ones(3))
    assert torch.equal(out, torch.full((2, 3), 3.0))


class Norm(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.norm = torch.nn.LayerNorm(size)  # normalized_shape is a constant of the module

    def forward(self, x):
        return self.norm(x)


def test_a_size_fixed_by_the_constructor_stays_a_literal(tmp_path):
    imported = spec_from(Norm, [torch.randn(12, 48)], init_inputs=[48], reference="inline", name="norm")
    assert imported.signature == ("norm(x: Tensor[N, 48], norm_weight: Tensor[48], norm_bias: Tensor[48]) "
                                  "-> Tensor[N, 48]")
    assert any(f.startswith("x.shape[1] is fixed at 48") for f in imported.flags)
    checks(imported, tmp_path)


def test_the_kernelbench_example_file_imports_and_checks(tmp_path):
    from conftest import REPO
    from specgen.importing import import_target

    imported = import_target(str(REPO / "examples" / "import" / "rmsnorm_model.py"))
    assert imported.name == "rmsnorm_model"
    assert imported.signature == "rmsnorm_model(x: Tensor[N, D], weight: Tensor[D]) -> Tensor[N, D]"
    assert imported.benchmark == [{"N": 16384, "D": 4096}]
    assert imported.reference_mode == "inline" and "class Model(nn.Module)" in imported.reference
    spec = checks(imported, tmp_path)
    out = spec.reference_fn()(x=torch.ones(2, 4), weight=torch.full((4,), 3.0))
    assert torch.allclose(out, torch.full((2, 4), 3.0), atol=1e-5)


def test_a_file_with_a_plain_function_and_get_inputs(tmp_path):
    from specgen.importing import import_target

    module = tmp_path / "ops_file.py"
    module.write_text(textwrap.dedent('''
        import torch

        def gelu_bias(x, bias):
            return torch.nn.functional.gelu(x + bias)

        def get_inputs():
            return [torch.randn(32, 24), torch.randn(24)]
    '''))
    imported = import_target(f"{module}:gelu_bias")
    assert imported.signature == "gelu_bias(x: Tensor[N, D], bias: Tensor[D]) -> Tensor[N, D]"
    checks(imported, tmp_path)


def test_refusals_say_why():
    with pytest.raises(ImportRefused, match="fails on its example inputs"):
        spec_from(matmul, [torch.randn(3, 4), torch.randn(5, 6)])
    with pytest.raises(ImportRefused, match="several symbols"):
        spec_from(lambda x: x.reshape(-1), [torch.randn(3, 4)], name="flat")
    with pytest.raises(ImportRefused, match="defined inside a function"):
        spec_from(lambda x: x * 2, [torch.randn(3)], name="double")
    with pytest.raises(ImportRefused, match="returns float"):
        spec_from(lambda x: float(x.sum()), [torch.randn(3)], name="total")


def test_the_signature_round_trips():
    imported = spec_from(rms_ref, [torch.randn(8, 4), torch.randn(4)])
    assert str(parse_signature(imported.signature)) == imported.signature
