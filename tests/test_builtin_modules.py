"""References that build nn.Modules: their parameters and buffers are constants of the
reference (modules.py); constant fills lower, anything else is refused."""
from __future__ import annotations

import pytest

from builtin_support import check_backward, check_forward, own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin import build_source
from specgen.agents.builtin.families import flat
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.modules import constant_value


@pytest.mark.parametrize("name, dims", [("module_layernorm", {"N": 5}),
                                        ("module_layernorm_shape", {"N": 3, "D": 37}),
                                        ("module_batchnorm_eval", {"N": 2, "H": 5, "W": 9})])
def test_module_references_lower_and_match_on_the_cpu(name, dims):
    spec = own_spec(name)
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_buffers_copied_in_from_inputs_are_the_inputs():
    """A module's running statistics loaded from the spec's inputs (copy_ under no_grad): the
    copies are the inputs, read per channel by the flat kernel (session 21, a development probe)."""
    spec = own_spec("module_batchnorm_loaded")
    check_forward(spec, {"N": 2, "C": 5, "L": 9})
    program = lower_spec(spec)["forward"]
    assert flat.plan_of(program) is not None
    assert {n.attrs["field"] for n in program.nodes() if n.op == "load"} == {"x", "running_mean", "running_var"}


def test_batchnorm_in_eval_mode_is_a_flat_pointwise_kernel():
    programs = lower_spec(own_spec("module_batchnorm_eval"))
    assert all(flat.plan_of(p) is not None for p in programs.values())


@pytest.mark.parametrize("name, why", [("module_linear", "not one value throughout")])
def test_varying_or_updated_module_tensors_are_refused(name, why):
    with pytest.raises(AgentRefused) as info:
        build_source(own_spec(name))
    assert why in str(info.value) and "LLM agent" in str(info.value)


def test_layernorm_of_one_symbolic_int_lowers():
    """nn.LayerNorm(x.shape[-1]) (one SymInt, refused before: LayerNorm took it for a shape to
    iterate) is built with the size as an Integral SymInt (modules.IntegralSymInt); the module is
    float32, so it is checked on float32 inputs (the interpreter in float64)."""
    import torch

    from specgen.agents.builtin.interp import run_program
    from specgen.inputs import make_inputs

    spec = own_spec("module_layernorm_symbolic")
    program = lower_spec(spec)["forward"]
    for dims in ({"N": 3, "D": 19}, {"N": 1, "D": 2}):
        args = make_inputs(spec.signature, dims, "float32", seed=3)
        outs = {"out": torch.full((dims["N"], dims["D"]), float("nan"), dtype=torch.float64)}
        run_program(program, {"x": args["x"].double()}, {}, dims, outs)
        torch.testing.assert_close(outs["out"], spec.reference_fn()(**args).double(), rtol=1e-5, atol=1e-5)


def test_constant_value_is_the_one_fill_or_none():
    import torch

    assert constant_value(torch.ones(4)) == 1.0
    assert constant_value(torch.zeros(2, 3, dtype=torch.int64)) == 0
    assert constant_value(torch.arange(3.0)) is None
    assert constant_value(torch.empty(0)) is None


def test_module_classes_are_restored_after_tracing():
    import torch

    init = torch.nn.LayerNorm.__dict__["__init__"]
    lower_spec(own_spec("module_layernorm"))
    assert torch.nn.LayerNorm.__dict__["__init__"] is init
    assert not getattr(torch.nn.Module._apply, "__specgen_wrapped__", False)


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["module_layernorm", "module_layernorm_shape", "module_batchnorm_eval"])
def test_module_kernels_verify_on_the_gpu(name):
    from specgen.verify import verify_kernel

    spec = own_spec(name)
    verdict = verify_kernel(spec, build_source(spec))
    assert verdict.passed, verdict.summary()


def test_batchnorm_in_training_mode_lowers_to_the_axis_family_with_batch_statistics():
    """Its running-statistics update (an in-place copy into the module's buffer) reaches no
    output: the module is built anew on every call. The output normalizes with the batch's own
    statistics, a reduction over N per channel: the axis family's kernel, checked here against
    the reference on the CPU interpreter (float32 inputs, as the module is float32)."""
    import torch

    from specgen.agents.builtin.families.axis_reduce import AxisProgram, run_axis_program
    from specgen.inputs import make_inputs

    spec = own_spec("module_batchnorm_train")
    program = lower_spec(spec)["forward"]
    assert isinstance(program, AxisProgram)
    for n in (3, 17):
        args = make_inputs(spec.signature, {"N": n}, "float32", seed=3)
        outs = {"out": torch.full((n, 32), float("nan"), dtype=torch.float64)}
        run_axis_program(program, {"x": args["x"].double()}, {}, {"N": n}, outs)
        torch.testing.assert_close(outs["out"], spec.reference_fn()(**args).double(), rtol=1e-5, atol=1e-5)
