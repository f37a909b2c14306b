"""Value classes outside the reference's domain (verify/domain.py): a reference that checks its
inputs' values (F.binary_cross_entropy wants [0, 1], and NaN fails) is never fed the class it
refuses, and the verdict says which class was left out. On the GPU that refusal is a device-side
assert in the verifier's own process (held-out problem bce_probs, session 18)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify.domain import reference_domain
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


def bce_infinities_as_zero(k, t, dims):  # a cheat: +-inf inputs taken as 0 (a fast path without them)
    z, q = t["z"].double(), t["t"].double()
    z, q = torch.where(z.isinf(), 0.0, z), torch.where(q.isinf(), 0.0, q)
    p, q = torch.sigmoid(z), torch.sigmoid(q)
    t["out"].copy_((-(q * p.log().clamp_min(-100) + (1 - q) * (1 - p).log().clamp_min(-100)).mean()).float())


def test_the_class_the_reference_refuses_is_named_and_drawn_only_where_it_is_taken(tmp_path):
    domain = reference_domain(bce_spec(tmp_path))
    assert list(domain.rejected) == [("specials", "float32")]
    problem = domain.rejected[("specials", "float32")]
    assert "between 0 and 1" in problem and "bce_of_sigmoids.yaml" in problem
    # NaN makes a NaN probability or target (refused, both); +-inf makes 0 or 1 (taken): both
    # inputs draw infinities in the class's cases
    assert "specials" in domain.of("float32")
    assert domain.overrides("specials", "float32") == (("z", "infinities"), ("t", "infinities"))
    assert "specials in float32 (drawn with z: infinities, t: infinities)" in domain.describe()


def test_a_reference_without_value_checks_refuses_no_class():
    from conftest import SPECS

    domain = reference_domain(load_spec(SPECS / "softmax.yaml"))
    assert domain.rejected == {} and all(domain.of(d) == domain.of("bfloat16") for d in ("float32", "float16"))


def test_boundary_cases_draw_the_refused_class_only_where_it_is_taken(tmp_path):
    spec = bce_spec(tmp_path)
    assert all(not c.overrides for c in boundary_cases(spec, 1 << 13))
    special = [c for c in boundary_cases(spec, 1 << 13, domain=reference_domain(spec)) if c.distribution == "specials"]
    assert special and all(c.overrides == (("z", "infinities"), ("t", "infinities")) for c in special)
    assert "(z: infinities, t: infinities values)" in special[0].describe()


def test_infinities_the_reference_takes_are_still_checked(tmp_path):
    # the red team's cheat: with "specials" refused as a whole, +-inf inputs were never drawn
    spec = bce_spec(tmp_path)
    verdict = run_verification(spec, fakes.PyKernel(spec, bce_infinities_as_zero),
                               Options(examples=8, budget=1 << 13, seed=3), device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()


ENERGY = """\
name: energy_bce
description: BCE of squared-energy shares x^2 / (sum x^2 + 1) per row against sigmoid(t).
signature: "energy_bce(x: Tensor[N, D], t: Tensor[N, D]) -> Tensor[] float32"
dtypes: [float32, float16]
dims: {N: [1, 64], D: [1, 256]}
reference: |
  import torch
  import torch.nn.functional as F

  def reference(x, t):
      work = torch.float64 if x.dtype == torch.float64 else torch.float32
      e = x * x
      p = e / (e.sum(-1, keepdim=True) + 1)
      return F.binary_cross_entropy(p.to(work), torch.sigmoid(t.to(work)))
"""


def energy_forward(k, t, dims, flush_large=False):
    x, q = t["x"], torch.sigmoid(t["t"].double())
    if flush_large and x.dtype == torch.float32:  # the cheat: |x| > 50 taken as 0 in float32
        x = torch.where(x.abs() > 50, torch.zeros_like(x), x)
    e = x * x  # in the input's dtype, as the reference: float16 overflows to inf, then NaN
    p = (e / (e.sum(-1, keepdim=True) + 1)).double()
    t["out"].copy_((-(q * p.log().clamp_min(-100) + (1 - q) * (1 - p).log().clamp_min(-100)).mean()).float())


def test_a_class_refused_in_one_dtype_is_still_drawn_in_the_others(tmp_path):
    path = tmp_path / "energy_bce.yaml"
    path.write_text(ENERGY)
    spec = load_spec(path)
    domain = reference_domain(spec)
    assert ("huge", "float16") in domain.rejected and ("huge", "float32") not in domain.rejected
    assert domain.overrides("huge", "float32") == () and domain.overrides("huge", "float16") == (("x", "normal"),)
    cheat = lambda k, t, dims: energy_forward(k, t, dims, flush_large=True)  # noqa: E731
    verdict = run_verification(spec, fakes.PyKernel(spec, cheat), Options(examples=8, budget=1 << 13, seed=3),
                               device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()


def test_a_correct_kernel_passes_and_the_verdict_names_the_class_left_out(tmp_path):
    spec = bce_spec(tmp_path)
    verdict = run_verification(spec, fakes.PyKernel(spec, bce_forward), Options(examples=8, budget=1 << 13, seed=3),
                               device="cpu")
    assert verdict.passed, verdict.summary()
    assert "refuses: specials in float32 (drawn with z: infinities, t: infinities)" in verdict.detail


def test_a_wrong_kernel_still_fails(tmp_path):
    spec = bce_spec(tmp_path)
    verdict = run_verification(spec, fakes.PyKernel(spec, bce_forgets_the_sigmoid),
                               Options(examples=8, budget=1 << 13, seed=3), device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
PICKY = """\
name: picky_sum
description: Row sums (the reference refuses NaN, and large values once there are over 40 rows).
signature: "picky_sum(x: Tensor[N, D]) -> Tensor[N] float32"
dtypes: [float32]
dims: {N: [1, 256], D: [1, 256]}
reference: |
  import torch

  def reference(x):
      if x.isnan().any() or (x.shape[0] > 40 and (x.abs() > 1e3).any()):
          raise ValueError("picky_sum: values out of range")
      work = torch.float64 if x.dtype == torch.float64 else torch.float32
      return x.to(work).sum(-1)
"""


def row_sums(k, t, dims):
    t["out"].copy_(t["x"].double().sum(-1).float())


def test_a_case_the_screen_missed_is_skipped_and_counted_not_fatal(tmp_path):
    # the screen's shapes (37, 2, 1 rows) never reach 40 rows: outlier and huge cases over 40 rows
    # still meet the refusal, on the CPU before the kernel runs, and are skipped (the red team's
    # Gaussian NLL died mid-verification on such a case)
    path = tmp_path / "picky_sum.yaml"
    path.write_text(PICKY)
    spec = load_spec(path)
    assert "outliers" in reference_domain(spec).of("float32")
    verdict = run_verification(spec, fakes.PyKernel(spec, row_sums), Options(examples=20, budget=1 << 13, seed=3),
                               device="cpu")
    assert verdict.passed, verdict.summary()
    assert "case(s) skipped where the reference refused their values" in verdict.detail


GAUSS_NLL = """\
name: gauss_nll
description: Elementwise Gaussian negative log-likelihood of x under N(mu, exp(log_s)^2).
signature: "gauss_nll(x: Tensor[N, D], mu: Tensor[N, D], log_s: Tensor[N, D]) -> Tensor[N, D]"
dtypes: [float32]
dims: {N: [1, 4096], D: [1, 4096]}
reference: |
  import torch
  from torch.distributions import Normal

  def reference(x, mu, log_s):
      return -Normal(mu, log_s.exp(), validate_args=True).log_prob(x)
"""


def test_a_class_one_input_refuses_is_still_drawn_on_the_others(tmp_path):
    # validate_args=True: torch._dynamo turns the distributions' default validation off for the
    # whole process once it is set up (the builtin generator traces), so the spec says it
    # the red team's case: a large log_s makes exp() 0 or inf, a scale Normal refuses; x and mu
    # take large values (the loss at x = 300 is finite), and were left without them
    path = tmp_path / "gauss_nll.yaml"
    path.write_text(GAUSS_NLL)
    domain = reference_domain(load_spec(path))
    for cls in ("large", "huge", "outliers"):
        assert cls in domain.of("float32") and domain.overrides(cls, "float32") == (("log_s", "normal"),)


WHITENED = """\
name: whitened_dot
description: Row dot products of x with whitened weights w (the reference checks w's variance).
signature: "whitened_dot(x: Tensor[N, D], w: Tensor[N, D], scale: float = 1.0) -> Tensor[N] float32"
dtypes: [float32]
dims: {N: [1, 256], D: [1, 256]}
benchmark: [{N: 256, D: 256}]
reference: |
  import torch

  def reference(x, w, scale=1.0):
      if w.numel() >= 1024 and not 0.7 < float(w.double().var()) < 1.4:
          raise ValueError("whitened_dot: w must have unit variance")
      work = torch.float64 if x.dtype == torch.float64 else torch.float32
      return (x.to(work) * w.to(work)).sum(-1) * scale
"""


def whitened_spec(tmp_path):
    path = tmp_path / "whitened_dot.yaml"
    path.write_text(WHITENED)
    return load_spec(path)


class ScaledKernel(fakes.PyKernel):
    """A stand-in that sees its scalars (PyKernel's functions get the tensors only)."""

    def call(self, direction, tensors, scalars, dims, stream) -> int:
        self.scale = scalars.get("scale", 1.0)
        return super().call(direction, tensors, scalars, dims, stream)


def row_dots(k, t, dims):
    t["out"].copy_(((t["x"].double() * t["w"].double()).sum(-1) * k.scale).float())


def test_uniform_and_tiny_values_are_refused_on_w_alone(tmp_path):
    # uniform values in [-1, 1] have variance 1/3: w refuses them, x takes them (tiny ones too)
    domain = reference_domain(whitened_spec(tmp_path))
    for cls in ("uniform", "tiny"):
        assert (cls, "float32") in domain.rejected
        assert cls in domain.of("float32") and domain.overrides(cls, "float32") == (("w", "normal"),)


def test_a_fresh_draw_takes_another_class_on_the_inputs_the_screen_draws_it_on(tmp_path):
    from specgen.verify.strategies import fresh_case, make_case

    domain = reference_domain(whitened_spec(tmp_path))
    case = make_case({"N": 37, "D": 37}, "float32", seed=5)
    fresh = fresh_case(case, 6, domain)
    assert (fresh.seed, fresh.distribution, fresh.overrides) == (6, "uniform", (("w", "normal"),))
    # a case of another class: its overrides were that class's, not uniform's
    special = make_case({"N": 37, "D": 37}, "float32", seed=5, distribution="specials",
                        overrides=(("w", "normal"),))
    assert fresh_case(special, 6, domain).overrides == (("w", "normal"),)
    assert fresh_case(special, 6).overrides == ()  # no screen: uniform on every input
    # a uniform case is redrawn from normal values: still another class than the first call's
    assert fresh_case(fresh, 7, domain).distribution == "normal"
    # a dtype where the screen refused uniform outright: the case's own classes at the new seed
    refused = type(domain)({"float32": ("normal", "large")}, {("uniform", "float32"): "refused"})
    assert fresh_case(case, 6, refused) == make_case({"N": 37, "D": 37}, "float32", seed=6)


def test_every_fresh_draw_of_the_capture_repeated_and_timed_checks_keeps_the_screen(tmp_path, monkeypatch):
    # the capture check, the repeated calls and every other timed set drew "uniform" on every
    # input, the screen's per-input classes ignored: w's uniform values made the reference raise
    from specgen.verify import engine

    spec = whitened_spec(tmp_path)
    domain = reference_domain(spec)
    prepared = []

    def recording(spec_, case, *args, **kw):
        prepared.append(case)
        return real(spec_, case, *args, **kw)

    real = engine.prepare
    monkeypatch.setattr(engine, "prepare", recording)
    verdict = run_verification(spec, ScaledKernel(spec, row_dots), Options(examples=4, budget=1 << 13, seed=3),
                               device="cpu")
    assert verdict.passed, verdict.summary()
    uniform = [c for c in prepared if c.distribution == "uniform"]
    assert len(uniform) >= 4  # the smoke capture, the repeated calls, the full-size capture, timed sets
    assert any(c.distribution == "tiny" and c.scalars for c in prepared)  # the scalars' low end
    assert all(c.overrides == domain.overrides(c.distribution, c.dtype) for c in prepared)


def test_the_screen_reports_each_class_it_screens(tmp_path):
    """The screen runs the reference on the CPU before the kernel's first case; on a busy H200 it
    took over a minute with no progress message, and the worker called that a hung kernel."""
    from specgen.verify import domain as domain_module

    spec = bce_spec(tmp_path)
    domain_module._DOMAINS.pop(spec.hash(), None)  # screened afresh, not from an earlier test's cache
    heard = []
    screened = reference_domain(spec, heard.append)
    classes = set(screened.of("float32")) | {cls for cls, _ in screened.rejected}
    assert len(heard) >= len(classes) >= 2
    assert all(any(f" {cls} values" in text for text in heard) for cls in classes)
    assert all("float32" in text for text in heard)
    cached = []
    reference_domain(spec, cached.append)
    assert cached == []  # once per process: the cache answers
