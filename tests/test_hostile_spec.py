"""Issue 14: careless and hostile spec files get a file:line error naming the field, never a
traceback, a hang or a process that eats memory (cases 3, 5, 7 and 9 of the issue)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.errors import SpecError
from specgen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent

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
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, text: str) -> SpecError:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    error = caught.value
    assert error.location is not None and str(error.location).startswith(str(path))
    return error


def renamed(op: str) -> str:
    return GOOD.replace("name: scale", f"name: {op}").replace("scale(x", f"{op}(x")


# ---------------------------------------------------------------------------- case 3: names

@pytest.mark.parametrize("op, why", [
    ("class", "Python keyword"), ("None", "Python keyword"), ("torch", "torch"), ("new", "C++ keyword"),
    ("_private", "starts with '_'"), ("a__b", "reserved"), ("errno", "macro"),
])
def test_op_names_that_break_the_package_are_refused(tmp_path, op, why):
    error = spec_error(tmp_path, renamed(op))
    assert error.field == "name" and error.location.line == 1 and why in error.message


@pytest.mark.parametrize("old, new, name, why", [
    ("alpha: float", "lambda: float", "lambda", "Python keyword"),
    ("alpha: float", "torch: float", "torch", "torch"),
    ("x: Tensor[N, D], alpha", "new: Tensor[N, D], alpha", "new", "C++ keyword"),
    ("-> Tensor[N, D]", "-> this: Tensor[N, D]", "this", "C++ keyword"),
    ("-> Tensor[N, D]", "-> (y: Tensor[N, D], int: Tensor[N, D])", "int", "C++ keyword"),
    ("Tensor[N, D]", "Tensor[N, threadIdx]", "threadIdx", "built-in"),
    ("alpha: float", "workspace_bytes: float", "workspace_bytes", "every kernel ABI struct"),
    ("-> Tensor[N, D]", "-> workspace: Tensor[N, D]", "workspace", "every kernel ABI struct"),
])
def test_parameter_output_and_dimension_names_are_checked(tmp_path, old, new, name, why):
    text = GOOD.replace(old, new)
    if name == "threadIdx":
        text = text.replace("D: [1, 64]}", "threadIdx: [1, 4]}")
    error = spec_error(tmp_path, text)
    assert error.field == "signature" and error.location.line == 3 and why in error.message
    line = text.splitlines()[2]
    assert line[error.location.column - 1:].startswith(name)  # the column points at the name


def test_gradient_names_must_not_collide(tmp_path):
    text = GOOD.replace("x: Tensor[N, D], alpha: float = 2.0", "x: Tensor[N, D], grad_x: Tensor[N, D]")
    text = text.replace("def reference(x, alpha=2.0):", "def reference(x, grad_x):") + "backward: reference\n"
    error = spec_error(tmp_path, text)
    assert "'grad_x'" in error.message and "gradient" in error.message


def test_a_300_character_op_name_is_a_spec_error(tmp_path):
    error = spec_error(tmp_path, renamed("op" + "x" * 298))
    assert error.field == "name" and "300 characters" in error.message


def test_non_ascii_op_name_is_refused(tmp_path):
    error = spec_error(tmp_path, GOOD.replace("name: scale", "name: scalé"))
    assert error.field in ("name", "signature")


# ---------------------------------------------------------------------------- case 5: YAML bombs

ALIAS_BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def run_check_limited(path: Path, memory_mb: int = 6144, timeout: float = 120) -> subprocess.CompletedProcess:
    """`specgen check` in a child with a memory cap, so a regression cannot take the machine down."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({0}, {0})); "
            "from specgen.cli import main; sys.exit(main(['check', sys.argv[1]]))").format(memory_mb << 20)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_alias_bomb_is_refused_quickly_with_its_line(tmp_path):
    path = write(tmp_path, ALIAS_BOMB)
    assert len(ALIAS_BOMB.encode()) < 600
    result = run_check_limited(path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "aliases" in result.stderr and "Traceback" not in result.stderr + result.stdout


def test_alias_bomb_in_process(tmp_path):
    error = spec_error(tmp_path, ALIAS_BOMB)
    assert "expands to more than" in error.message and error.location.line >= 1


def test_recursive_alias_is_refused(tmp_path):
    error = spec_error(tmp_path, GOOD + "tolerance: &t {float32: *t}\n")
    assert "recursive" in error.message


def test_deep_nesting_is_refused_with_its_line(tmp_path):
    error = spec_error(tmp_path, GOOD + "tolerance: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested more than" in error.message and error.location.line == 9


def test_oversized_spec_file_is_refused(tmp_path):
    error = spec_error(tmp_path, GOOD + "# " + "x" * (2 << 20) + "\n")
    assert "bytes" in error.message


def test_complex_mapping_key_is_a_spec_error(tmp_path):
    error = spec_error(tmp_path, GOOD + "? [a, b]\n: 1\n")
    assert "plain text" in error.message or "unknown key" in error.message


def test_huge_integer_literal_is_a_spec_error(tmp_path):
    error = spec_error(tmp_path, GOOD.replace("[1, 64], D", "[1, " + "9" * 6000 + "], D"))
    assert error.location is not None


# ---------------------------------------------------------------------------- case 7: sizes

def test_dim_of_2_pow_40_is_a_spec_error(tmp_path):
    error = spec_error(tmp_path, GOOD.replace("D: [1, 64]", f"D: [1, {2**40}]"))
    assert error.field == "dims.D" and error.location.line == 5 and "larger than" in error.message


def test_fixed_dim_of_2_pow_40_is_a_spec_error(tmp_path):
    error = spec_error(tmp_path, GOOD.replace("D: [1, 64]", f"D: {2**40}"))
    assert error.field == "dims.D" and "larger than" in error.message


def test_literal_size_of_2_pow_40_is_a_spec_error(tmp_path):
    text = GOOD.replace("x: Tensor[N, D]", f"x: Tensor[N, {2**40}]").replace("-> Tensor[N, D]", "-> Tensor[N]")
    text = text.replace(", D: [1, 64]", "").replace("return x * alpha", "return (x * alpha).sum(-1)")
    error = spec_error(tmp_path, text)
    assert error.field == "signature" and "larger than" in error.message


def test_nine_dimensional_signature_is_a_spec_error(tmp_path):
    dims = ", ".join(f"A{k}" for k in range(9))
    text = GOOD.replace("Tensor[N, D], alpha", f"Tensor[{dims}], alpha").replace("-> Tensor[N, D]", f"-> Tensor[{dims}]")
    text = text.replace("{N: [1, 64], D: [1, 64]}", "{" + ", ".join(f"A{k}: [1, 2]" for k in range(9)) + "}")
    error = spec_error(tmp_path, text)
    assert error.field == "signature" and "at most 8" in error.message and error.location.line == 3


def test_infinite_scalar_default_is_a_spec_error(tmp_path):
    error = spec_error(tmp_path, GOOD.replace("alpha: float = 2.0", "alpha: float = inf"))
    assert error.field == "signature" and "finite" in error.message


# ---------------------------------------------------------------------------- case 9: validation

@pytest.mark.parametrize("shapes, why", [
    ("[{N: 128, D: 8}]", "outside dims.N"),
    ("[{N: -4, D: 8}]", "outside dims.N"),
])
def test_benchmark_shapes_must_lie_in_the_dims_ranges(tmp_path, shapes, why):
    error = spec_error(tmp_path, GOOD + f"benchmark: {shapes}\n")
    assert why in error.message and error.field == "benchmark[0].N" and error.location.line == 9


def test_unbounded_dims_are_refused(tmp_path):
    error = spec_error(tmp_path, GOOD.replace("N: [1, 64]", "N: [1, 99999999999999999999999]"))
    assert error.field == "dims.N" and "upper bound" in error.message


def test_duplicate_dtypes_are_refused(tmp_path):
    error = spec_error(tmp_path, GOOD.replace("[float32, bfloat16]", "[float32, bfloat16, float32]"))
    assert error.field == "dtypes[2]" and error.location.line == 4 and "twice" in error.message
