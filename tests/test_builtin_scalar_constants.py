"""Numbers the reference computes from a float scalar while it is traced become expressions
of the scalar (builtin/scalar_constants.py), or the spec is refused: never a constant baked in.
A held-out CELU was lowered with exp(x * 8100) in its backward (1 / alpha at the traced
sentinel) for every alpha, and every variant failed verification on the H200 (session 20)."""
from __future__ import annotations

import math

import pytest
import torch

from builtin_support import own_spec
from specgen.agents.base import AgentRefused
from specgen.agents.builtin.generator import lower_spec
from specgen.agents.builtin.interp import run_program
from specgen.agents.builtin.scalar_constants import COMPOSED, FORMS, forms_of, match
from specgen.agents.builtin.trace import SENTINEL_BASE, sentinel
from specgen.spec import load_spec


def _backward_at(spec, alpha: float, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the lowered backward's grad_x by the CPU interpreter, autograd's) at this alpha."""
    ref = spec.reference_fn()
    leaf = x.clone().requires_grad_()
    out = ref(leaf, alpha)
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    (want,) = torch.autograd.grad(out, leaf, grad_out)
    got = {"grad_x": torch.full_like(x, float("nan"))}
    n, d = x.shape
    run_program(lower_spec(spec)["backward"], {"x": x, "out": out.detach(), "grad_out": grad_out},
                {"alpha": alpha}, {"N": n, "D": d}, got)
    return got["grad_x"], want


@pytest.mark.parametrize("alpha", [0.1, 1.0, 2.7])
def test_celu_backward_follows_alpha(alpha):
    spec = own_spec("elu_scaled")
    x = torch.randn(5, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    got, want = _backward_at(spec, alpha, x)
    # torch's CELU backward takes 1 / alpha of alpha rounded to float32 (1e-8 off in float64);
    # the kernel's is exact. A baked-in 1 / alpha at the traced value would be off by orders.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_a_number_computed_from_a_scalar_in_an_unknown_way_is_refused(tmp_path):
    path = tmp_path / "odd_scale.yaml"
    path.write_text(
        "name: odd_scale\n"
        "description: x times a number computed from the scalar in Python (alpha * 1.0507)\n"
        'signature: "odd_scale(x: Tensor[N, D], alpha: float = 1.0) -> Tensor[N, D]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64], D: [1, 256]}\n"
        "reference: |\n"
        "  def reference(x, alpha=1.0):\n"
        "      return x * (alpha * 1.0507 + 0.25)\n")
    with pytest.raises(AgentRefused, match=r"computed from a scalar.*LLM agent"):
        lower_spec(load_spec(path))


def test_every_form_is_matched_back_to_its_scalar_and_nothing_else_is():
    sentinels = {sentinel(SENTINEL_BASE, 0): "alpha", sentinel(SENTINEL_BASE, 1): "beta"}  # as trace._scalars makes them
    table = forms_of(sentinels)
    for value, name in sentinels.items():
        for form, (fn, _) in FORMS.items():
            assert match(fn(value), table) == (form, name, 1.0)
            assert match(0.5 * fn(value), table) == (form, name, 0.5)
            if form not in COMPOSED:  # composed forms (sqrt(1 - a)) only as Python's math computes them, in double
                assert match(float(torch.tensor(fn(value), dtype=torch.float32)), table) == (form, name, 1.0)
    for plain in (0.0, 1.0, -1.0, 0.5, 2.0, math.pi, 1e-5, 0.044715, 8192.0):
        assert match(plain, table) is None


@pytest.mark.parametrize("delta", [0.3, 1.0, 4.5])
def test_huber_forward_follows_delta_through_a_scaled_form(delta):
    """F.huber_loss's decomposition computes 0.5 * delta at trace time (SCALES)."""
    spec = own_spec("huber_delta")
    gen = torch.Generator().manual_seed(2)
    x, y = (torch.randn(4, 33, generator=gen, dtype=torch.float64) * 3 for _ in range(2))
    want = spec.reference_fn()(x, y, delta)
    got = {"out": torch.full_like(x, float("nan"))}
    run_program(lower_spec(spec)["forward"], {"x": x, "y": y}, {"delta": delta}, {"N": 4, "D": 33}, got)
    assert torch.allclose(got["out"], want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("expression", ["x * (a + c)", "x * (a / b)", "x * (a * c)", "x * (a - b + c)"])
def test_numbers_computed_from_several_scalars_are_refused(tmp_path, expression):
    """With sentinels in an arithmetic progression a + c was 2 * b (lowered as that), and a / b
    was the same number in both traces (baked in as a constant): session 21 review."""
    path = tmp_path / "several.yaml"
    path.write_text(
        "name: several\n"
        "description: a number computed from several float scalars\n"
        'signature: "several(x: Tensor[N, D], a: float = 1.0, b: float = 2.0, c: float = 0.5) -> Tensor[N, D]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64], D: [1, 256]}\n"
        "reference: |\n"
        "  def reference(x, a=1.0, b=2.0, c=0.5):\n"
        f"      return {expression}\n")
    with pytest.raises(AgentRefused, match=r"computed from a scalar.*LLM agent"):
        lower_spec(load_spec(path))


def test_sentinels_have_no_simple_relations():
    from itertools import combinations

    from specgen.agents.builtin.trace import OTHER_SENTINEL_BASE

    for base in (SENTINEL_BASE, OTHER_SENTINEL_BASE):
        values = [sentinel(base, k) for k in range(8)]
        table = forms_of({v: f"s{k}" for k, v in enumerate(values)})
        for a, b in combinations(values, 2):
            for combined in (a + b, a - b, b - a, a * b, a / b, b / a):
                assert match(combined, table) is None


@pytest.mark.parametrize("name", ["sigmoid_focal_loss_gamma", "bce_probs_class_weight_loss"])
def test_probe_losses_match_the_reference_on_the_cpu(name):
    """A focal loss takes 1 - alpha and, in its backward, gamma - 1 at trace time (forms
    one_minus, minus_one); a BCE with a [D] class weight computes on it before its broadcast
    (a part load in the axis family). Development problems, session 21."""
    from builtin_support import check_backward, check_forward
    from specgen.spec import load_spec

    from pathlib import Path

    spec = load_spec(Path(__file__).resolve().parents[1] / "benchmarks" / "level1" / "specs" / f"{name}.yaml")
    check_forward(spec, {"N": 3, "D": 37})
    check_backward(spec, {"N": 3, "D": 37})


@pytest.mark.parametrize("expression, refused", [
    ("x + torch.full_like(x, a)", False),      # the fill is the scalar's expression, not the sentinel
    ("x * torch.tensor(a, dtype=x.dtype).exp()", True),  # a tensor constant of the trace
    ("x * int(a * 100000)", True),             # an int computed from a scalar
])
def test_numbers_made_from_scalars_in_python_are_expressions_or_refused(tmp_path, expression, refused):
    """Session 21 review (a fuzz of 251 specs): these lowered with the traced value inside."""
    path = tmp_path / "pyscalar.yaml"
    path.write_text(
        "name: pyscalar\n"
        "description: a number made from float scalars in Python\n"
        'signature: "pyscalar(x: Tensor[N, D], a: float = 1.0, b: float = 0.5) -> Tensor[N, D]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64], D: [1, 256]}\n"
        "reference: |\n"
        "  import torch\n"
        "  def reference(x, a=1.0, b=0.5):\n"
        f"      return {expression}\n")
    spec = load_spec(path)
    if refused:
        with pytest.raises(AgentRefused, match=r"LLM agent"):
            lower_spec(spec)
        return
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for a in (-0.4, 2.5):
        got = {"out": torch.full_like(x, float("nan"))}
        run_program(lower_spec(spec)["forward"], {"x": x}, {"a": a, "b": 0.5}, {"N": 3, "D": 5}, got)
        torch.testing.assert_close(got["out"], spec.reference_fn()(x, a, 0.5))


@pytest.mark.parametrize("alpha", [0.05, 0.5, 0.93])
def test_composed_forms_follow_the_scalar(tmp_path, alpha):
    """An affine step then a unary one (a DDIM step's sqrt(1 - alpha), 1 / (1 + alpha), log(1 - alpha),
    refused before session 40: held-out problems-v11's DDIM step)."""
    path = tmp_path / "composed.yaml"
    path.write_text(
        "name: composed\n"
        "description: numbers computed from the scalar by an affine step then a unary one\n"
        'signature: "composed(x: Tensor[N, D], alpha: float = 0.5 in [0.01, 0.99]) -> Tensor[N, D]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64], D: [1, 256]}\n"
        "reference: |\n"
        "  import math\n\n"
        "  def reference(x, alpha=0.5):\n"
        "      return x * math.sqrt(1.0 - alpha) + x / (1.0 + alpha) - math.log(1.0 - alpha) + 2.0 / math.sqrt(1 - alpha)\n")
    spec = load_spec(path)
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = {"out": torch.full_like(x, float("nan"))}
    run_program(lower_spec(spec)["forward"], {"x": x}, {"alpha": alpha}, {"N": 3, "D": 7}, got)
    torch.testing.assert_close(got["out"], spec.reference_fn()(x, alpha), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("expression", [
    "x * (a + a ** 4)",  # a at the small sentinels, to 1e-11
    "x * (2 * math.sin(a / 2))",  # a chord: a - a^3 / 24
    "x * math.log((1 + a / 2) / (1 - a / 2))",  # 2 atanh(a / 2): a + a^3 / 12
    "x * (math.sqrt(1 - a) + a ** 6)",  # a composed form plus a^6
    "x / (1 + a + a ** 6)",
])
def test_near_misses_of_a_form_are_refused(tmp_path, expression):
    """Numbers that equal a form of the scalar to within its reach at the small sentinels, where a
    Taylor series makes many functions alike, were baked in as that form (a red team, session 40:
    2 sin(a / 2) lowered as a, 3.5% off at a = 0.9). The second trace takes each ranged scalar
    inside its range (trace.in_range_value), where they differ."""
    path = tmp_path / "near_miss.yaml"
    path.write_text(
        "name: near_miss\n"
        "description: a number computed from the scalar that is close to a form of it only near 0\n"
        'signature: "near_miss(x: Tensor[N, D], a: float = 0.9 in [0.01, 0.99]) -> Tensor[N, D]"\n'
        "dtypes: [float32]\n"
        "dims: {N: [1, 64], D: [1, 256]}\n"
        "reference: |\n"
        "  import math\n\n"
        "  def reference(x, a=0.9):\n"
        f"      return {expression}\n")
    with pytest.raises(AgentRefused, match=r"computed from a scalar.*LLM agent"):
        lower_spec(load_spec(path))


def test_the_cpu_check_takes_scalars_inside_their_ranges_too():
    """check_forward(scalar_point=...) runs a ranged scalar at that point of its range, not its
    default: a program right only at the default fails there."""
    from specgen.agents.builtin.cpu_check import _inputs

    spec = own_spec("huber_delta")  # delta: float = 1.0 in [0.1, 10.0]
    (param,) = spec.signature.scalars
    lo, hi = param.value_range
    args = _inputs(spec, {"N": 2, "D": 3}, seed=0, scalar_point=0.5)
    assert args[param.name] == pytest.approx(lo + (hi - lo) * 0.5)
    assert _inputs(spec, {"N": 2, "D": 3}, seed=0, scalar_point=None)[param.name] == param.default
