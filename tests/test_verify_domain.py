"""Value classes outside the reference's domain (verify/domain.py): a reference that checks its
inputs' values (F.binary_cross_entropy wants [0, 1], and NaN fails) is never fed the class it
refuses, and the verdict says which class was left out. On the GPU that refusal is a device-side
assert in the verifier's own process (held-out problem bce_probs, session 18)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify.domain import rejected_value_classes
from specgen.verify.engine import Options, run_verification
from specgen.verify.strategies import boundary_cases

BCE = """\
name: bce_of_sigmoids
description: Binary cross-entropy of sigmoid(z) against soft targets sigmoid(t), a mean.
signature: "bce_of_sigmoids(z: Tensor[N, D], t: Tensor[N, D]) -> Tensor[] float32"
dtypes: [float32]
dims: {N: [1, 64], D: [1, 256]}
reference: |
  import torch
  import torch.nn.functional as F

  def reference(z, t):
      work = torch.float64 if z.dtype == torch.float64 else torch.float32
      return F.binary_cross_entropy(torch.sigmoid(z.to(work)), torch.sigmoid(t.to(work)))
"""


def bce_spec(tmp_path):
    path = tmp_path / "bce_of_sigmoids.yaml"
    path.write_text(BCE)
    return load_spec(path)


def bce_forward(k, t, dims):  # the kernel's math: no value check, NaN in gives NaN out
    p, q = torch.sigmoid(t["z"].double()), torch.sigmoid(t["t"].double())
    loss = -(q * p.log().clamp_min(-100) + (1 - q) * (1 - p).log().clamp_min(-100)).mean()
    t["out"].copy_(loss.float())


def bce_forgets_the_sigmoid(k, t, dims):
    p, q = t["z"].double().clamp(1e-6, 1 - 1e-6), torch.sigmoid(t["t"].double())
    t["out"].copy_(F.binary_cross_entropy(p, q).float())


def test_the_class_the_reference_refuses_is_named_with_its_error(tmp_path):
    rejected = rejected_value_classes(bce_spec(tmp_path))
    assert list(rejected) == ["specials"]
    assert "between 0 and 1" in rejected["specials"] and "bce_of_sigmoids.yaml" in rejected["specials"]


def test_a_reference_without_value_checks_refuses_no_class():
    from conftest import SPECS

    assert rejected_value_classes(load_spec(SPECS / "softmax.yaml")) == {}


def test_boundary_cases_leave_the_refused_class_out(tmp_path):
    spec = bce_spec(tmp_path)
    every = {c.distribution for c in boundary_cases(spec, 1 << 13)}
    assert "specials" in every
    kept = tuple(c for c in ("normal", "large", "tiny", "negative", "uniform", "huge", "denormal", "outliers",
                             "rounded") if c != "specials")
    assert "specials" not in {c.distribution for c in boundary_cases(spec, 1 << 13, classes=kept)}


def test_a_correct_kernel_passes_and_the_verdict_names_the_class_left_out(tmp_path):
    spec = bce_spec(tmp_path)
    verdict = run_verification(spec, fakes.PyKernel(spec, bce_forward), Options(examples=8, budget=1 << 13, seed=3),
                               device="cpu")
    assert verdict.passed, verdict.summary()
    assert "not drawn: specials" in verdict.detail


def test_a_wrong_kernel_still_fails(tmp_path):
    spec = bce_spec(tmp_path)
    verdict = run_verification(spec, fakes.PyKernel(spec, bce_forgets_the_sigmoid),
                               Options(examples=8, budget=1 << 13, seed=3), device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
