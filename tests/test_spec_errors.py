"""Every class of bad spec gets an error naming the file, line (column) and field, and no traceback."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from specgen.checking import check_spec
from specgen.cli import main
from specgen.errors import SpecError, UsageError
from specgen.spec import load_spec

GOOD = """\
name: scale
description: Multiply by two.
signature: "scale(x: Tensor[N, D], alpha: float = 2.0) -> Tensor[N, D]"
dtypes: [float32, bfloat16]
dims: {N: [1, 64], D: [1, 64]}
reference: |
  def reference(x, alpha=2.0):
      return x * alpha
"""


def write(tmp_path: Path, text: str, name: str = "scale.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path) -> SpecError:
    result = check_spec(path)
    assert result.error is not None, "the spec was accepted"
    return result.error


def test_good_spec_passes(tmp_path):
    result = check_spec(write(tmp_path, GOOD))
    # two sizes a dtype, then every size at its lower bound
    assert result.ok and len(result.runs) == 5 and result.runs[-1] == "float32 N=1 D=1 (smallest sizes)"


def test_a_key_given_twice_names_both_lines(tmp_path):
    """YAML keeps a repeated key's last value without a word: the first `dims` would be dropped
    (held-out bad_specs-v2, session 36)."""
    path = write(tmp_path, GOOD + "dims: {N: [1, 8], D: [1, 8]}\n")
    error = error_of(path)
    assert (error.location.line, error.location.column) == (9, 1)
    assert "`dims` is given twice" in str(error) and "first on line 5" in str(error)
    nested = write(tmp_path, GOOD.replace("D: [1, 64]}", "D: [1, 64], N: [2, 4]}"), "nested.yaml")
    assert "`N` is given twice" in str(error_of(nested))


def test_a_random_reference_is_refused(tmp_path):
    """Dropout in training mode draws new numbers at each call: no kernel can match it."""
    text = GOOD.replace("      return x * alpha", "      import torch\n      return torch.nn.functional.dropout(x * alpha, 0.5)")
    error = error_of(write(tmp_path, text))
    assert error.field == "reference" and "not deterministic" in str(error) and error.location.line == 7
    assert "seed" in error.hint


def test_a_shape_wrong_only_at_the_smallest_sizes_is_found(tmp_path):
    """squeeze() drops the row axis only when there is one row: the random sizes miss it."""
    text = GOOD.replace('-> Tensor[N, D]"', '-> Tensor[N]"').replace("return x * alpha",
                                                                      "return (x * alpha).sum(-1, keepdim=True).squeeze()")
    error = error_of(write(tmp_path, text))
    assert error.field == "reference" and "has shape ()" in str(error) and "N=1" in str(error)


@pytest.mark.parametrize("dtype,bounds,ok", [("int16", "[1, 32768]", True), ("int16", "[1, 32769]", False),
                                             ("uint8", "[1, 256]", True), ("int8", "[1, 200]", False),
                                             ("int32", "[1, 65536]", True)])
def test_an_index_range_must_fit_its_integer_dtype(tmp_path, dtype, bounds, ok):
    """`in [0, V)` with V up to 131072 cannot be passed as int16 (held-out bad_specs-v2)."""
    text = (GOOD.replace('alpha: float = 2.0) ->', f'i: Tensor[N] {dtype} in [0, V), alpha: float = 2.0) ->')
            .replace("D: [1, 64]}", f"D: [1, 64], V: {bounds}}}").replace("def reference(x, alpha", "def reference(x, i, alpha"))
    path = write(tmp_path, text)
    if ok:
        assert check_spec(path).ok
        return
    error = error_of(path)
    assert error.field == "signature" and f"'i' is {dtype}" in str(error) and "holds" in str(error)
    assert error.location.line == 3 and "int32" in error.hint


def test_unknown_key_suggests_the_closest(tmp_path):
    path = write(tmp_path, GOOD + "tolerence: {float32: {atol: 1e-3}}\n")
    error = error_of(path)
    assert str(error.location) == f"{path}:9:1"
    assert "unknown key 'tolerence'" in str(error) and "did you mean 'tolerance'" in str(error)


def test_bad_signature_points_at_the_column(tmp_path):
    path = write(tmp_path, GOOD.replace("Tensor[N, D], alpha", "Tensor[N, D) alpha"))
    error = error_of(path)
    # the text starts at column 13 (after the quote); ")" is at offset 20 in the signature
    assert (error.location.line, error.location.column) == (3, 13 + 20)
    assert error.field == "signature" and "expected ',' or ']'" in error.message


def test_unknown_dtype(tmp_path):
    path = write(tmp_path, GOOD.replace("[float32, bfloat16]", "[float32, bfloat61]"))
    error = error_of(path)
    assert error.location.line == 4 and error.field.startswith("dtypes")
    assert "bfloat61" in str(error)


def test_unbound_output_dimension(tmp_path):
    path = write(tmp_path, GOOD.replace("-> Tensor[N, D]", "-> Tensor[N, M]"))
    error = error_of(path)
    assert error.location.line == 3 and "'M' is not bound by any input" in str(error)


def test_missing_dim_range(tmp_path):
    path = write(tmp_path, GOOD.replace("dims: {N: [1, 64], D: [1, 64]}", "dims: {N: [1, 64]}"))
    error = error_of(path)
    assert error.location.line == 5 and "no range given for dimension(s) D" in str(error)


def test_reference_missing(tmp_path):
    path = write(tmp_path, GOOD.replace("def reference(", "def referenc("))
    error = error_of(path)
    assert error.location.line == 7 and "must define a function named `reference`" in str(error)


def test_reference_raising_points_at_the_yaml_line(tmp_path):
    path = write(tmp_path, GOOD.replace("return x * alpha", "return x * undefined_name"))
    error = error_of(path)
    assert error.location.line == 8 and "NameError" in str(error) and "undefined_name" in str(error)


def test_reference_with_wrong_output_shape(tmp_path):
    path = write(tmp_path, GOOD.replace("return x * alpha", "return (x * alpha).sum(-1)"))
    error = error_of(path)
    assert error.location.line == 7 and "has shape" in str(error)


def test_reference_syntax_error(tmp_path):
    path = write(tmp_path, GOOD.replace("return x * alpha", "return x *"))
    error = error_of(path)
    assert error.location.line == 8 and "syntax error" in str(error)


def test_yaml_syntax_error(tmp_path):
    path = write(tmp_path, GOOD.replace("dims: {N: [1, 64], D: [1, 64]}", "dims: {N: [1, 64], D: [1, 64]"))
    error = error_of(path)
    assert error.location.line in (5, 6) and "YAML syntax error" in str(error)


def test_name_must_match_signature(tmp_path):
    path = write(tmp_path, GOOD.replace("name: scale", "name: scaler"))
    error = error_of(path)
    assert error.location.line == 3 and "'scale' but name is 'scaler'" in str(error)


def test_benchmark_shape_must_set_every_dim(tmp_path):
    path = write(tmp_path, GOOD + "benchmark:\n  - {N: 16}\n")
    error = error_of(path)
    assert error.location.line == 10 and "does not set 'D'" in str(error)


def test_folder_without_specs(tmp_path):
    with pytest.raises(UsageError, match="no spec files"):
        from specgen.spec import find_spec_files

        find_spec_files([tmp_path])


def test_cli_reports_file_and_line_without_traceback(tmp_path, capsys):
    good = write(tmp_path, GOOD)
    bad = write(tmp_path, GOOD.replace("return x * alpha", "return x * undefined_name"), "bad.yaml")
    code = main(["check", str(good), str(bad)])
    captured = capsys.readouterr()
    assert code == 2
    assert f"{bad}:8" in captured.err and "Traceback" not in captured.err + captured.out


def test_cli_empty_folder_is_a_usage_error(tmp_path, capsys):
    assert main(["check", str(tmp_path)]) == 2
    assert "no spec files" in capsys.readouterr().err


def test_spec_hash_changes_with_the_parsed_spec(tmp_path):
    a = load_spec(write(tmp_path, GOOD, "a.yaml"))
    b = load_spec(write(tmp_path, GOOD.replace("# comment", "") + "# a comment changes nothing\n", "b.yaml"))
    c = load_spec(write(tmp_path, GOOD.replace("[1, 64], D", "[1, 128], D"), "c.yaml"))
    assert a.hash() == b.hash() != c.hash()


@pytest.mark.parametrize("body", ["return (x * alpha).detach()",  # the graph cut
                                  "return torch.argmax(x * alpha, -1, keepdim=True).expand(x.shape).to(x.dtype)",
                                  "with torch.no_grad():\n        return x * alpha"])
def test_a_backward_needs_a_reference_that_autograd_can_differentiate(tmp_path, body):
    """backward: kernel takes its gradients' truth from autograd through the reference: an output
    with no graph back to the input is an error at check time, not a GPU-time surprise."""
    text = GOOD.replace("      return x * alpha", "      import torch\n      " + body.replace("\n", "\n  ")) \
        + "backward: kernel\n"
    error = error_of(write(tmp_path, text))
    assert error.field == "backward" and "'x'" in str(error) and "no autograd graph" in str(error)
    assert error.location is not None and str(error.location.path).endswith("scale.yaml")
    assert "backward: none" in (error.hint or "")
    # the same reference with its graph: accepted; an integer output beside a differentiable one too
    assert check_spec(write(tmp_path, GOOD + "backward: kernel\n", "ok.yaml")).ok
    both = GOOD.replace('-> Tensor[N, D]"', '-> (Tensor[N] , Tensor[N] int64)"').replace(
        "      return x * alpha", "      import torch\n      return torch.max(x * alpha, dim=-1)")
    assert check_spec(write(tmp_path, both + "backward: kernel\n", "pair.yaml")).ok
