"""References that build nn.Modules with parameters or buffers (modules.py): a user-defined
Module with nn.Parameter attributes, modules sized from a symbolic size (nn.LayerNorm(x.shape[-1])
with bias=False or elementwise_affine=False, nn.RMSNorm, a user's module of x.shape[1] channels),
converted with .to(x) / .to(device, dtype) / .type() / .float(), their tensors either passed in
through torch.func.functional_call or used as built (constant fills, baked in). Each lowers, and
the CPU interpreter matches the reference and its autograd."""
from __future__ import annotations

import pytest

from builtin_support import check_backward, check_forward, own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.generator import lower_spec

CASES = [
    ("mparam_layernorm_nobias_call", [{"B": 2, "T": 3, "D": 37}, {"B": 1, "T": 1, "D": 5}]),
    ("mparam_layernorm_noaffine_float", [{"N": 3, "D": 37}, {"N": 1, "D": 2}]),
    ("mparam_layernorm_own_affine", [{"N": 4, "D": 29}]),
    ("mparam_rmsnorm_call", [{"N": 3, "D": 41}, {"N": 2, "D": 1}]),
    ("mparam_user_channel_gain", [{"B": 2, "C": 5, "L": 9}, {"B": 1, "C": 1, "L": 3}]),
    ("mparam_user_own_constants", [{"N": 3, "C": 17}]),
    ("mparam_user_literal_nested", [{"N": 6}, {"N": 1}]),
    ("mparam_user_nested_symbolic", [{"N": 3, "D": 23}]),
]


@pytest.mark.parametrize("name, sizes", CASES, ids=[c[0] for c in CASES])
def test_module_parameter_references_lower_and_match_on_the_cpu(name, sizes):
    spec = own_spec(name)
    for dims in sizes:
        check_forward(spec, dims)
        if spec.backward != "none":
            check_backward(spec, dims)


def test_parameters_given_through_functional_call_are_the_inputs():
    """The module's own tensors are replaced for the call: the kernel loads the inputs and bakes in
    no fill of the module (its dead initialization is not lowered)."""
    program = lower_spec(own_spec("mparam_user_channel_gain"))["forward"]
    loads = {n.attrs["field"] for n in program.nodes() if n.op == "load"}
    assert loads == {"x", "gain", "shift"}


@pytest.mark.parametrize("name, line, why", [
    # drawn at random in the module's __init__: named where it is drawn
    ("mparam_user_random", 16, "prims.normal"),
    # the module's own check that its size is a Python int raises while tracing
    ("mparam_user_int_check", 17, "cannot trace"),
])
def test_modules_that_cannot_be_baked_in_are_refused_at_their_line(name, line, why):
    spec = own_spec(name)
    with pytest.raises(AgentRefused) as info:
        build_source(spec)
    text = str(info.value)
    assert f"{spec.path}:{line}:" in text and why in text and "LLM agent" in text


def test_module_methods_are_restored_after_tracing():
    import numbers

    import torch

    apply = torch.nn.Module.__dict__["_apply"]
    init = torch.nn.LayerNorm.__dict__["__init__"]
    lower_spec(own_spec("mparam_user_channel_gain"))
    assert torch.nn.Module.__dict__["_apply"] is apply and torch.nn.LayerNorm.__dict__["__init__"] is init
    # a plain SymInt is left as torch has it; only the wrapper the modules are given is Integral
    assert not issubclass(torch.SymInt, numbers.Integral)


def test_to_on_a_module_outside_a_trace_is_torchs():
    """Outside a trace the modules are untouched: .to() still converts a module in place."""
    import torch

    norm = torch.nn.LayerNorm(4, bias=False)
    weight = norm.weight
    norm.to(torch.float64)
    assert norm.weight is weight and norm.weight.dtype == torch.float64 and norm.bias is None


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_module_parameter_kernels_verify_on_the_gpu(name):
    from specgen.verify import verify_kernel

    spec = own_spec(name)
    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()
