"""Math functions of a traced size (symbolic_math.py): `1 / math.sqrt(x.shape[-1])`, `d ** -0.5`,
`log(n)` stay functions of the dims in the lowered program (a node on a `dim`), not the example's
number: the trace fixed the size before (refused: "fixes a symbolic size to its example value").
CPU: the IR and the interpreter at several sizes; nvcc; GPU: the verifier."""
from __future__ import annotations

import math

import pytest
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec

from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.symbolic_math import SHIM, symbolic_math

OPS = ["size_scaled_softmax", "size_power_tanh"]


def _math_of_dims(program) -> set[str]:
    """The ops applied to a dim anywhere upstream (through casts)."""
    found = set()
    for n in program.nodes():
        if n.op in ("sqrt", "pow", "log", "log2") and any(m.op == "dim" for a in n.args for m in [a, *a.args]):
            found.add(n.op)
    return found


def test_the_scale_is_computed_from_the_dim_not_baked_in():
    for direction, program in lower_spec(own_spec("size_scaled_softmax")).items():
        assert "sqrt" in _math_of_dims(program), direction
    for direction, program in lower_spec(own_spec("size_power_tanh")).items():
        found = _math_of_dims(program)  # math.log of a size: torch's symbolic log2, times ln 2
        assert "pow" in found and "log2" in found, direction


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dims", [{"R": 3, "K": 5, "N": 3, "D": 5}, {"R": 2, "K": 64, "N": 9, "D": 64},
                                  {"R": 1, "K": 1, "N": 1, "D": 1}])
def test_the_lowered_programs_match_the_reference_at_other_sizes(name, dims):
    spec = own_spec(name)
    dims = {k: v for k, v in dims.items() if k in spec.dims}
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_the_scaled_scores_a_row_max_reduces_are_rounded_once_never_contracted():
    """x * scale - max(x * scale) contracted into an FMA is the exact product minus the rounded one:
    inf where the row's max element should give 1, at bfloat16 `huge` values on the H200 (session 37)."""
    source = build_source(own_spec("size_scaled_softmax"))
    forward = source[:source.index("size_scaled_softmax_bwd")]
    scaled = [line for line in forward.splitlines() if "const acc_t mul_" in line and "p_scores" in line]
    assert scaled and all("sg::mul_rn(" in line for line in scaled)
    backward = source[source.index("size_scaled_softmax_bwd"):]  # products no max reduces: left to the compiler
    assert any("const acc_t mul_" in line and "mul_rn" not in line for line in backward.splitlines())


def test_an_int_size_to_an_int_power_stays_an_int(tmp_path):
    """`(d ** 2) // 4` is integer arithmetic on sizes: products of the dim, then a floor division."""
    from specgen.spec import load_spec

    text = own_spec("size_power_tanh").path.read_text()
    path = tmp_path / "size_power_tanh.yaml"
    path.write_text(text.replace("x * d ** -0.5 * (1.0 + log(n))", "x * ((d ** 2) // 4) * 1e-3"))
    spec = load_spec(path)
    program = lower_spec(spec)["forward"]
    floordivs = [n for n in program.nodes() if n.op == "floordiv"]
    assert floordivs and all(n.dtype == "int" and n.args[0].op == "mul" and n.args[0].dtype == "int"
                             for n in floordivs)
    assert not any(n.op == "pow" for n in program.nodes())
    for dims in ({"N": 3, "D": 5}, {"N": 2, "D": 64}, {"N": 1, "D": 1}):
        check_forward(spec, dims)
        check_backward(spec, dims)


def test_the_swap_is_undone_and_leaves_plain_numbers_to_math():
    namespace = {"math": math, "sqrt": math.sqrt, "other": len}
    fn = eval("lambda: None", namespace)
    with symbolic_math(fn):
        assert namespace["math"] is SHIM and namespace["sqrt"] is SHIM.sqrt and namespace["other"] is len
        assert SHIM.sqrt(16) == 4.0 and SHIM.log(8, 2) == pytest.approx(3.0) and SHIM.pow(2, 10) == 1024.0
    assert namespace["math"] is math and namespace["sqrt"] is math.sqrt


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)
