"""Two mistakes `specgen check` let through at the first contact with held-out bad_specs-v3
(session 37; the two files read after the run, the other 22 not):
- a scalar's range taking in a value where the reference is undefined (`x / temperature` with
  temperature in [0, 2]): the verifier draws the closed range, so every kernel would be checked
  against NaN there; the check now runs the float64 reference at each end of each range;
- a reference that builds a tensor on a fixed 'cuda' device: torch's error named no fix; the
  message now says to build tensors on the inputs' device."""
from __future__ import annotations

from specgen.checking import check_spec
from specgen.sandbox import shared_sandbox

SPEC = """name: scaled_tanh
description: tanh of x divided by a temperature.
signature: "scaled_tanh(x: Tensor[N, D], temperature: float = 1.0 in [{lo}, 2.0]) -> Tensor[N, D]"
dtypes: [float32]
dims: {{N: [1, 64], D: [1, 64]}}
reference: |
  import torch

  def reference(x, temperature=1.0):
      return torch.tanh({body})
backward: none
benchmark:
  - {{N: 64, D: 64}}
"""


def _check(tmp_path, lo="0.0", body="x / torch.tensor(temperature, dtype=x.dtype)"):
    path = tmp_path / "scaled_tanh.yaml"
    path.write_text(SPEC.format(lo=lo, body=body))
    return path, check_spec(path, samples=1, sandbox=shared_sandbox())


def test_a_range_end_where_the_reference_is_nan_is_refused_at_the_signature(tmp_path):
    # tanh(x / 0) is +-1 for x != 0 but NaN at x == 0: use 0 / 0 everywhere, so the end is NaN for sure
    path, result = _check(tmp_path, body="(x * temperature) / torch.tensor(temperature, dtype=x.dtype)")
    assert not result.ok
    text = str(result.error)
    assert f"{path}:3" in text and "'temperature' at 0" in text and "an end of its range" in text
    assert "[0.02, 2]" in result.error.hint


def test_a_range_end_where_the_reference_raises_is_refused_with_the_range(tmp_path):
    path, result = _check(tmp_path, body="x * (1.0 / temperature)")
    assert not result.ok and "an end of its range" in str(result.error) and "ZeroDivisionError" in str(result.error)


def test_a_range_where_the_reference_is_defined_passes(tmp_path):
    _, result = _check(tmp_path, lo="0.1")
    assert result.ok, result.error


def test_outputs_already_non_finite_on_the_draw_are_not_blamed_on_the_range(tmp_path):
    _, result = _check(tmp_path, body="torch.log(x) / torch.tensor(temperature, dtype=x.dtype)")
    assert result.ok, result.error  # log of a normal draw is NaN at every temperature


def test_a_tensor_on_a_fixed_cuda_device_gets_the_inputs_device_as_its_fix(tmp_path):
    _, result = _check(tmp_path, lo="0.1", body="x + torch.zeros(x.shape[-1], device='cuda')")
    assert not result.ok
    assert "device=x.device" in (result.error.hint or ""), result.error
