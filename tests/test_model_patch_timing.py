"""benchmarks/model_patch.py times its variants in turn (a host-bound decode step drifted 1.66x
between two runs of one variant on the H200, more than the variants differ): the helper that
takes them round by round, checked with a fake timer (no GPU)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import model_patch  # noqa: E402


def test_variants_are_timed_round_by_round_and_each_gets_its_median_per_round():
    calls = []
    drift = iter(range(100))  # the machine slows down call after call

    def timer(step, warmup, iters):
        calls.append((step, warmup, iters))
        slow = next(drift)
        return [step_cost[step] + slow, step_cost[step] + slow + 10, step_cost[step] + slow - 10]

    step_cost = {"eager": 100.0, "specgen": 90.0}
    medians = model_patch.interleaved({"eager": "eager", "specgen": "specgen"}, rounds=3, warmup=2, iters=7,
                                      timer=timer)
    assert [c[0] for c in calls] == ["eager", "specgen"] * 3  # in turn, not one variant's rounds first
    assert all(c[1:] == (2, 7) for c in calls)
    assert medians == {"eager": [100.0, 102.0, 104.0], "specgen": [91.0, 93.0, 95.0]}
    # a sequential order would have charged the drift to the later variant; in turn it is shared
    assert all(s < e for e, s in zip(medians["eager"], medians["specgen"]))


def test_liger_defaults_are_timed_after_the_interleaved_group():
    """Liger's default patch rewrites transformers' module functions (rope), which would change
    every model timed after it: it is built last and timed alone."""
    names = [name for name, _ in model_patch.variants(type("A", (), {"package": "x"})(), base=None)]
    assert names[-1] == "liger" and names[:3] == ["eager", "specgen", "liger-rmsnorm"]
