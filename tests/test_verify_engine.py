"""The verifier's checks on a CPU, with Python stand-ins for kernels (tests/verify_fakes.py):
every reason a kernel can be rejected for, reached by the cheat it is meant to catch, and
the counterexample that comes with it."""
from __future__ import annotations

import pytest

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify.engine import Options, Session, run_verification

SMALL = Options(examples=4, budget=1 << 13, seed=1)


@pytest.fixture(scope="module")
def gelu(specs_dir=None):
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


def verdict_of(spec, impl, backward=None, options=SMALL):
    return run_verification(spec, fakes.PyKernel(spec, impl, backward), options, device="cpu")


def test_a_correct_kernel_passes_forward_and_backward(gelu):
    verdict = verdict_of(gelu, fakes.gelu_forward)
    assert verdict.passed, verdict.summary()
    assert verdict.cases > 20
    assert {key.split()[0] for key in verdict.tolerances} == {"forward", "backward"}
    assert {key.split()[1] for key in verdict.tolerances} == set(gelu.dtypes)
    assert verdict.timings["verify_s"] > 0


@pytest.mark.parametrize("impl, reason, where", [
    (fakes.does_nothing, "unwritten-output", "every element"),
    (fakes.first_256_only, "unwritten-output", "tail"),
    (fakes.drops_tail, "unwritten-output", "tail"),
    (fakes.mutates_input, "input-mutated", None),
    (fakes.half_math, "wrong-result", None),
    (fakes.noisy, "nondeterministic", None),
    # same pointers from case to case: the skipped call leaves an earlier run's output or run B's
    # fill (which of the two shows first depends on the random fills)
    (fakes.pointer_cache, ("nondeterministic", "unwritten-output"), None),
    (fakes.narrow_rows, "wrong-result", "columns 64"),
    (fakes.bad_config, "cuda-error", None),
    (fakes.illegal_address, "crash", None),
])
def test_each_cheat_gets_its_reason(gelu, impl, reason, where):
    verdict = verdict_of(gelu, impl)
    assert verdict.reason in (reason if isinstance(reason, tuple) else (reason,)), verdict.summary()
    assert verdict.detail
    if where is not None:
        assert any(where in w for w in verdict.counterexample.where), verdict.summary()
    if reason in ("unwritten-output", "wrong-result", "input-mutated"):
        ce = verdict.counterexample
        assert ce.direction == "forward" and ce.case["dims"] and ce.case["dtype"] in gelu.dtypes
        assert "seed" in ce.case


def test_crash_is_fatal_and_cuda_error_is_not(gelu):
    assert verdict_of(gelu, fakes.illegal_address).fatal
    assert not verdict_of(gelu, fakes.bad_config).fatal


def test_the_fp16_shortcut_reports_errors_and_tolerance(gelu):
    verdict = verdict_of(gelu, fakes.half_math)
    ce = verdict.counterexample
    assert ce.case["dtype"] == "float32"
    assert ce.max_abs_error > 1e-5 and ce.max_rel_error > 0
    assert ce.index is not None and ce.expected != ce.got
    assert "forward float32" in verdict.tolerances
    assert "atol=1e-05 rtol=1e-05" in verdict.summary()


def test_a_wrong_backward_is_caught_in_the_backward_direction(gelu):
    verdict = verdict_of(gelu, fakes.gelu_forward, fakes.wrong_backward)
    assert verdict.reason == "wrong-result", verdict.summary()
    assert verdict.counterexample.direction == "backward"
    assert verdict.counterexample.output == "grad_x"


def test_hypothesis_finds_and_shrinks_a_shape_bug(gelu):
    """Boundary cases skipped: the drawn cases alone find a bug that needs D > 300 and shrink
    the counterexample to a small one."""
    from specgen.verify.isolation import LocalRunner

    runner = LocalRunner(gelu, fakes.PyKernel(gelu, fakes.wide_rows_wrong), device="cpu")
    session = Session(gelu, runner, Options(examples=60, budget=1 << 14), lambda text: None, device="cpu")
    from specgen.verify.verdict import Failure

    with pytest.raises(Failure) as caught:
        session.hypothesis("forward")
    failure = caught.value
    assert failure.reason == "wrong-result"
    dims = failure.counterexample.case["dims"]
    assert 300 < dims["D"] <= 512, dims
    assert dims["N"] <= 2, dims


def test_a_nan_from_the_reference_is_not_an_unwritten_output(gelu):
    """-inf in, NaN out of the reference's float64 truth? No: GELU(-inf) is NaN in torch; a kernel
    computing it writes NaN, which must not read as 'never written'."""
    import torch

    from specgen.verify.compare import unwritten

    nan = torch.tensor([float("nan"), 1.0])
    written_nan = torch.tensor([float("nan"), 1.0])
    assert not unwritten(nan, written_nan, torch.tensor(float("nan")), torch.tensor(-3.140625)).any()
    still_fill = torch.tensor([float("nan"), 1.0]), torch.tensor([-3.140625, 1.0])
    assert unwritten(*still_fill, torch.tensor(float("nan")), torch.tensor(-3.140625)).tolist() == [True, False]


def test_an_offset_that_wraps_past_2_31_elements_fails_on_the_case_past_the_mark(gelu, monkeypatch):
    """The past-2^31 case (strategies.past_int32_case) is the one case whose largest tensor holds
    more elements than an int32 offset counts; here the mark is lowered so the CPU reaches it."""
    import math

    from specgen.verify import strategies

    from specgen.verify import engine, starved

    mark = 1 << 14  # above every other case of SMALL's budget (2^13 elements over all tensors)
    monkeypatch.setattr(strategies, "INT32_ELEMENTS", mark)
    # (but the call on more rows doubles the large case, past the lowered mark)
    monkeypatch.setattr(engine, "more_rows_case", lambda *args, **kw: None)
    # and so do the starved calls' widest row and many rows (starved.py): the smoke shape alone
    monkeypatch.setattr(starved, "starved_cases", lambda spec, seed, budget: [strategies.smoke_case(spec, seed)])
    wrapped = verdict_of(gelu, fakes.wraps_offsets_at(mark))
    assert wrapped.reason == "wrong-result", wrapped.summary()
    assert math.prod(wrapped.counterexample.case["dims"].values()) > mark
    assert verdict_of(gelu, fakes.gelu_forward).passed
    monkeypatch.setattr(strategies, "past_int32_case", lambda *args, **kw: None)
    assert verdict_of(gelu, fakes.wraps_offsets_at(mark)).passed  # no other case reaches the mark


def test_the_verdict_records_the_error_norm_against_the_references(gelu):
    """Measured on every checked output (checks.error_norm_ratio), shown beside the tolerance: an
    honest kernel's stays near the reference's; the bound it is to become is set on the GPU."""
    verdict = verdict_of(gelu, fakes.gelu_forward)
    ratios = [t["max_error_norm_ratio"] for t in verdict.tolerances.values()]
    assert len(ratios) == 2 * len(gelu.dtypes) and all(0.0 < r < 1.5 for r in ratios), ratios
    assert "its error norm up to" in verdict.summary()
