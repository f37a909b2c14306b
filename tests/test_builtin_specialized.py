"""The specialized family (families/specialized*.py): int and bool scalars with few values, one
kernel per combination of values, chosen at run time.

CPU: every combination's program matches the reference and autograd at its values (float64
interpreter); a value outside them is no kernel; too many values is a refusal that says how to
narrow them; the source dispatches on the scalars. nvcc: it compiles and exports only the spec's
entry points with C linkage. Not yet run on a GPU.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from specgen.agents.base import AgentRefused
from specgen.agents.builtin.cpu_check import check_backward, check_forward, run_lowered
from specgen.agents.builtin.families.specialized import MAX_INT_VALUES, SpecializedProgram, scalar_values
from specgen.agents.builtin.generator import build_source, lower_spec
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent / "specialized_specs"


def _spec():
    return load_spec(SPECS / "fake_quant_flag.yaml")


def test_each_value_of_the_int_and_bool_scalars_has_its_kernel_and_matches():
    spec = _spec()
    programs = lower_spec(spec)
    assert all(isinstance(p, SpecializedProgram) for p in programs.values())
    combos = [c.values for c in programs["forward"].choices]
    assert len(combos) == 14 and {"bits": 2, "symmetric": False} in combos and {"bits": 8, "symmetric": True} in combos
    for values in combos:
        check_forward(spec, {"N": 3, "D": 37}, scalars=values)
        check_backward(spec, {"N": 3, "D": 37}, scalars=values)


def test_the_kernels_differ_where_the_reference_branches():
    """The check can fail: bits=3's kernel run at bits=4 gives another answer than the reference."""
    spec = _spec()
    program = lower_spec(spec)["forward"]
    three = next(c for c in program.choices if c.values == {"bits": 3, "symmetric": True})
    x = torch.randn(4, 33, dtype=torch.float64)
    out = torch.full_like(x, float("nan"))
    run_lowered(lower_spec(three.spec)["forward"], {"x": x}, {"eps": 1e-6}, {"N": 4, "D": 33}, {"out": out})
    assert torch.allclose(out, spec.reference_fn()(x, bits=3, symmetric=True))
    assert not torch.allclose(out, spec.reference_fn()(x, bits=4, symmetric=True))


def test_a_value_outside_the_kernels_is_no_kernel():
    program = lower_spec(_spec())["forward"]
    x = torch.randn(2, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="no kernel"):
        program.run({"x": x}, {"bits": 9, "symmetric": True, "eps": 1e-6}, {"N": 2, "D": 5}, {"out": x.clone()})


def test_an_int_with_too_many_values_is_refused_with_how_to_narrow_it(tmp_path):
    text = (SPECS / "fake_quant_flag.yaml").read_text().replace("bits: int = 8 in [2, 8]", "bits: int = 8 in [2, 16]")
    path = tmp_path / "wide_bits.yaml"
    path.write_text(text.replace("name: fake_quant_flag", "name: wide_bits").replace(
        "fake_quant_flag(", "wide_bits("))
    spec = load_spec(path)
    with pytest.raises(AgentRefused, match=f"15 values.*at most {MAX_INT_VALUES}: narrow its range"):
        scalar_values(spec)
    with pytest.raises(AgentRefused, match="wide_bits.yaml"):
        lower_spec(spec)


def test_the_source_dispatches_on_the_scalars_and_exports_only_the_entry_points():
    source = build_source(_spec())
    assert "if (a->bits == 2 && a->symmetric == false) {" in source
    assert source.count("return cudaErrorInvalidValue;  // a value no kernel was made") == 2
    linked = re.findall(r'extern "C" \w+ (\w+)\(', source)
    assert sorted(linked) == sorted(f"fake_quant_flag_{d}{w}" for d in ("forward", "backward")
                                    for w in ("", "_workspace"))


@pytest.mark.nvcc
@pytest.mark.slow
def test_the_specialized_source_compiles():
    from specgen.agents.builtin.generator import compile_source

    spec = _spec()
    compiled = compile_source(spec, build_source(spec), arch="sm_90")
    assert not compiled.diagnostics, compiled.diagnostics


@pytest.mark.gpu
@pytest.mark.nvcc
def test_specialized_kernels_verify_on_the_gpu():
    from builtin_support import verifies_on_the_gpu

    verifies_on_the_gpu(_spec())


def test_a_value_whose_kernel_is_refused_is_named_in_the_refusal(tmp_path):
    path = tmp_path / "maybe_sorted.yaml"
    path.write_text(
        'name: maybe_sorted\ndescription: rows, sorted when asked.\n'
        'signature: "maybe_sorted(x: Tensor[N, D], ordered: bool = False) -> Tensor[N, D]"\ndtypes: [float32]\n'
        'dims: {N: [1, 64], D: [1, 64]}\n'
        'reference: |\n  import torch\n\n  def reference(x, ordered=False):\n'
        '      return torch.sort(x, dim=-1).values if ordered else x * 2\nbackward: none\n')
    with pytest.raises(AgentRefused) as info:
        lower_spec(load_spec(path))
    message = str(info.value)
    assert message.startswith(f"{path}:") and ": at ordered=True, " in message and "sort" in message
    assert "float scalars only" not in message  # the trace's first refusal says less
