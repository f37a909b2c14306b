"""Saved intermediates (issue 13): the `saved:` declaration, its errors, the ABI fields it adds
and what the verifier makes of it (docs/ARCHITECTURE.md "Saved intermediates")."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from specgen import abi
from specgen.errors import SpecError
from specgen.spec import load_spec
from specgen.verify.checks import check_close
from specgen.verify.data import prepare
from specgen.verify.strategies import make_case
from specgen.verify.verdict import Failure

SAVED = Path(__file__).resolve().parent / "saved_specs"
SPECS = Path(__file__).resolve().parent.parent / "specs"

CE = """\
name: ce
description: d
signature: "ce(logits: Tensor[N, C], target: Tensor[N] int64 in [0, C)) -> Tensor[] float32"
dtypes: [float32]
dims: {N: [1, 64], C: [1, 64]}
reference: |
  import torch
  import torch.nn.functional as F

  def reference(logits, target):
      return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), target)
backward: kernel
saved:
"""


def _spec(tmp_path, saved_lines: str, text: str = CE):
    path = tmp_path / "ce.yaml"
    path.write_text(text + textwrap.indent(saved_lines, "  ") + "\n")
    return load_spec(path), path


def test_a_declaration_parses_into_shape_dtype_and_expression():
    spec = load_spec(SAVED / "cross_entropy_lse.yaml")
    (lse,) = spec.saved_values
    assert (lse.name, lse.field, str(lse.type)) == ("lse", "saved_lse", "Tensor[N] float32")
    assert lse.expression == "torch.logsumexp(logits.float(), dim=-1)"
    assert lse.line == 16  # the YAML line: evaluation errors point there


def test_a_spec_without_saved_values_hashes_as_before():
    # the lock's hash of specs/cross_entropy.yaml, written before saved values existed
    from specgen.lock import Lock

    lock = Lock.load(SPECS)
    for op in ("cross_entropy", "rmsnorm"):
        assert load_spec(SPECS / f"{op}.yaml").hash() == lock.entries[op].spec_hash


def test_the_order_of_saved_values_is_in_the_hash(tmp_path):
    one, _ = _spec(tmp_path, 'a: "Tensor[N] float32 = logits.amax(-1).float()"\n'
                             'b: "Tensor[N] float32 = logits.amin(-1).float()"')
    two, _ = _spec(tmp_path, 'b: "Tensor[N] float32 = logits.amin(-1).float()"\n'
                             'a: "Tensor[N] float32 = logits.amax(-1).float()"')
    assert one.hash() != two.hash()
    assert [f.name for f in abi.fields(one) if f.role == "saved"] == ["saved_a", "saved_b"]


@pytest.mark.parametrize("line, message, column", [
    ('lse: "Tensor[N] flot = logits.sum(-1)"', "expected a dtype", 19),
    ('lse: "Tensor[N] float32"', "expected 'TYPE = EXPRESSION'", None),
    ('lse: "Tensor[N] float32 = logits.sum(-1"', "not valid Python", None),
    ('lse: "Tensor[M] float32 = logits.sum(-1)"', "dimension 'M' of saved value 'lse' is not bound", None),
    ('target: "Tensor[N] float32 = logits.sum(-1)"', "'target' is already a parameter", None),
    ('C: "Tensor[N] float32 = logits.sum(-1)"', "'C' is already a dimension", None),
    ('workspace: "Tensor[N] float32 = logits.sum(-1)"', "workspace", None),
    ('class: "Tensor[N] float32 = logits.sum(-1)"', "Python keyword", None),
])
def test_a_bad_declaration_is_an_error_at_its_line(tmp_path, line, message, column):
    with pytest.raises(SpecError) as caught:
        _spec(tmp_path, line)
    error = caught.value
    assert message in str(error)
    assert error.location.line == 14 and error.field.startswith("saved.")
    if column is not None:
        assert error.location.column == column


def test_a_saved_value_named_like_a_saved_field_of_an_input_is_refused(tmp_path):
    text = CE.replace("target: Tensor[N] int64 in [0, C))", "target: Tensor[N] int64 in [0, C), saved_m: Tensor[N])")
    text = text.replace("def reference(logits, target)", "def reference(logits, target, saved_m)")
    with pytest.raises(SpecError, match="'saved_m' is already a parameter"):
        _spec(tmp_path, 'm: "Tensor[N] float32 = logits.amax(-1).float()"', text)


def test_saved_values_need_a_backward_kernel(tmp_path):
    with pytest.raises(SpecError, match="backward: reference"):
        _spec(tmp_path, 'lse: "Tensor[N] float32 = logits.sum(-1)"', CE.replace("backward: kernel", "backward: reference"))


def test_the_forward_writes_them_after_its_outputs_and_the_backward_reads_them_after_the_forward_outputs():
    spec = load_spec(SAVED / "cross_entropy_lse.yaml")
    forward = [(f.name, f.role) for f in abi.fields(spec, "forward") if f.is_tensor]
    backward = [(f.name, f.role) for f in abi.fields(spec, "backward") if f.is_tensor]
    assert forward == [("logits", "input"), ("target", "input"), ("out", "output"), ("saved_lse", "saved")]
    assert backward == [("logits", "input"), ("target", "input"), ("out", "fwd_output"),
                        ("saved_lse", "saved_input"), ("grad_out", "grad_output"), ("grad_logits", "grad_input")]
    assert [f.written for f in abi.fields(spec, "forward") if f.is_tensor] == [False, False, True, True]
    assert not [f for f in abi.fields(spec, "backward") if f.role == "saved_input" and f.written]
    header = abi.header_text(spec)
    assert "  specgen_tensor saved_lse;          /* Tensor[N] float32  (float32) */" in header
    # the workspace stays last in both structs; ctypes lays the struct out as the header does
    for direction in ("forward", "backward"):
        names = [name for name, _ in abi.ctypes_struct(spec, direction)._fields_]
        assert names[-2:] == ["workspace", "workspace_bytes"] and "saved_lse" in names


def test_the_verifier_checks_a_saved_value_against_its_definition():
    spec = load_spec(SAVED / "cross_entropy_lse.yaml")
    data = prepare(spec, make_case({"N": 7, "C": 33}, "bfloat16", seed=3), "forward", "cpu")
    assert [slot.name for slot in data.outputs] == ["out", "saved_lse"]
    assert data.outputs[1].shape == (7,) and data.outputs[1].dtype == torch.float32
    logits = data.inputs["logits"]
    truth = torch.logsumexp(logits.double(), dim=-1)
    assert torch.allclose(data.truth["saved_lse"], truth, rtol=1e-6)
    out = torch.nn.functional.cross_entropy(logits.float(), data.inputs["target"])
    check_close(data, {"out": out, "saved_lse": truth.float()})
    with pytest.raises(Failure, match="saved_lse"):
        check_close(data, {"out": out, "saved_lse": truth.float() + 0.1})  # a wrong statistic fails (bf16: 8e-3 of ~3.5)


def test_the_backward_reads_the_definitions_values():
    spec = load_spec(SAVED / "rmsnorm_rstd.yaml")
    data = prepare(spec, make_case({"N": 5, "D": 40}, "float16", seed=1), "backward", "cpu")
    x = data.inputs["x"]
    assert list(data.inputs) == ["x", "weight", "out", "saved_rstd", "grad_out"]
    expected = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    assert data.inputs["saved_rstd"].dtype == torch.float32
    assert torch.equal(data.inputs["saved_rstd"], expected)
    assert [slot.name for slot in data.outputs] == ["grad_x", "grad_weight"]


def test_the_truth_of_a_definition_written_with_float_is_computed_in_float64():
    # `x.float().mean(-1)` on float64 copies: the casts stay float64, so the truth is the exact mean
    # (computed in float32 it was off by float32's rounding of a sum with cancellation, which a
    # kernel's own float32 sum, ordered differently, could not match: session 12 on the H200)
    spec = load_spec(SAVED / "layernorm_stats.yaml")
    data = prepare(spec, make_case({"N": 64, "D": 129}, "float32", seed=18, distribution="huge"), "forward", "cpu")
    x = data.inputs["x"].double()
    exact = x.mean(-1)
    assert data.truth["saved_mean"].dtype == torch.float64
    assert torch.equal(data.truth["saved_mean"], exact)
    in_float32 = x.float().mean(-1).double()
    assert not torch.equal(in_float32, exact)  # the float32 run differs: what the old truth was
    var = ((x - exact[:, None]) ** 2).mean(-1)
    torch.testing.assert_close(data.truth["saved_rstd"], torch.rsqrt(var + 1e-5), rtol=1e-12, atol=0)


def test_a_definition_that_still_narrows_in_the_truth_run_is_an_error_at_its_line(tmp_path):
    spec, _ = _spec(tmp_path, 'lse: "Tensor[N] float32 = torch.logsumexp(logits, dim=-1).type(torch.float32)"')
    with pytest.raises(SpecError) as caught:
        prepare(spec, make_case({"N": 3, "C": 4}, "float32"), "forward", "cpu")
    assert "comes back in float32 from float64 inputs" in str(caught.value)
    assert caught.value.location.line == 14 and "promote_types" in caught.value.hint


def test_an_expression_that_fails_is_reported_at_its_line(tmp_path):
    spec, path = _spec(tmp_path, 'lse: "Tensor[N] float32 = torch.logsumexp(logits, dim=5)"')
    with pytest.raises(SpecError) as caught:
        prepare(spec, make_case({"N": 3, "C": 4}, "float32"), "forward", "cpu")
    assert "saved value 'lse'" in str(caught.value) and caught.value.location.line == 14


def test_a_definition_of_the_wrong_shape_is_refused(tmp_path):
    spec, _ = _spec(tmp_path, 'lse: "Tensor[N] float32 = torch.logsumexp(logits, dim=-1, keepdim=True)"')
    with pytest.raises(SpecError, match=r"shape \(3, 1\); its declaration Tensor\[N\] float32 says \(3,\)"):
        prepare(spec, make_case({"N": 3, "C": 4}, "float32"), "forward", "cpu")


def test_specgen_check_evaluates_the_definitions(tmp_path):
    from specgen.checking import check_spec

    good = check_spec(SAVED / "cross_entropy_lse.yaml")
    assert good.ok, good.error
    path = tmp_path / "ce.yaml"
    path.write_text(CE + '  lse: "Tensor[N] float32 = torch.logsumexp(logits, dim=1, keepdim=True)"\n')
    bad = check_spec(path)
    assert not bad.ok and "saved value 'lse' has shape" in str(bad.error) and bad.error.location.line == 14


@pytest.mark.parametrize("value, message", [
    ("5", "valid dictionary"), ("[lse]", "valid dictionary"), ("{lse: 3}", "valid string"),
])
def test_a_saved_block_of_the_wrong_shape_is_a_spec_error(tmp_path, value, message):
    path = tmp_path / "ce.yaml"
    path.write_text(CE.replace("saved:\n", f"saved: {value}\n"))
    with pytest.raises(SpecError, match=message) as caught:
        load_spec(path)
    assert caught.value.field.startswith("saved") and caught.value.location.line == 13
