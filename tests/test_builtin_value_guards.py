"""Checks on tensor values that only raise (value_guards.py): F.gaussian_nll_loss's
`if torch.any(var < 0): raise`, `assert torch.all(...)`. The tracer answers each truth test so
the checks pass, confirms that the other answer raises (a check, not a branch), and the kernel
computes the passing side; a truth test whose both sides return a result is refused with its
line. The interpreter matches the reference in float64."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from builtin_support import check_backward, check_forward, own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.trace import trace
from specgen.agents.builtin.value_guards import traced_with_value_guards
from specgen.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
GAUSSIAN = REPO / "benchmarks" / "level1" / "specs" / "gaussian_nll_rowvar_loss.yaml"


@pytest.mark.parametrize("name, dims", [("guarded_sqrt", {"N": 3, "D": 7}), ("two_guards", {"N": 4, "D": 5}),
                                        ("gaussian", {"N": 5, "D": 7}), ("gaussian", {"N": 1, "D": 1})])
def test_guarded_references_match_in_float64(name, dims):
    spec = load_spec(GAUSSIAN) if name == "gaussian" else own_spec(name)
    for seed in range(3):
        check_forward(spec, dims, seed=seed)
        check_backward(spec, dims, seed=seed)


def _two_checks(x):
    if torch.any(torch.isnan(x)):
        raise ValueError("NaN input")
    assert torch.all(x.abs() < float("inf")), "infinite input"
    return torch.nn.functional.softplus(x)


def test_the_answers_pass_each_check_in_the_order_asked():
    """`if torch.any(isnan)`: raise on True (answered False); `assert torch.all(...)`: raise on
    False (answered True). The graph keeps neither test's value (no item(), no branch)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    calls = []

    def once():
        calls.append(1)
        return make_fx(_two_checks, tracing_mode="symbolic")(torch.randn(3, 4))

    graph, answers = traced_with_value_guards(once, __file__)
    assert answers == [False, True]
    assert len(calls) == 2 + 2  # one failed answer, the passing one, then each answer's other side
    targets = " ".join(str(n.target) for n in graph.graph.nodes)
    assert "softplus" in targets and "_local_scalar_dense" not in targets


@pytest.mark.parametrize("name, line", [("value_branch", 11), ("padding_branch_assert", 11),
                                        ("flag_branch_assert", 11)])
def test_a_branch_on_values_is_refused_with_its_line(name, line):
    """Both sides return a result; in the last two one side holds an `assert torch.all(...)`,
    which the other answers to later tests must not make look like a check (a red-team finding,
    session 33: the assert answered False made the branch pass for a guard)."""
    with pytest.raises(AgentRefused) as info:
        build_source(own_spec(name))
    assert f"{name}.yaml:{line}:" in str(info.value) and "branches on tensor values" in str(info.value)


def test_a_reference_that_always_raises_is_still_its_own_error(tmp_path):
    path = tmp_path / "always.yaml"
    path.write_text(
        "name: always\n"
        "description: raises whatever the values\n"
        'signature: "always(x: Tensor[N]) -> Tensor[N]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64]}\n"
        "reference: |\n"
        "  def reference(x):\n"
        "      raise ValueError('not implemented')\n")
    with pytest.raises(AgentRefused) as info:
        trace(load_spec(path), "forward")
    assert "always.yaml:8" in str(info.value) and "not implemented" in str(info.value)


@pytest.mark.nvcc
def test_the_gaussian_source_compiles():
    from specgen.agents.builtin.generator import compile_source

    spec = load_spec(GAUSSIAN)
    compile_source(spec, build_source(spec), arch="sm_90")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["guarded_sqrt", "gaussian"])
def test_the_kernels_verify_on_the_gpu(name):
    from specgen.verify import verify_kernel

    spec = load_spec(GAUSSIAN) if name == "gaussian" else own_spec(name)
    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()
