"""Verifier version 8's checks on how a kernel is called, on a CPU with Python stand-ins: the
first calls racing on two streams, graph replays and a call on fewer rows on a kept workspace
(held-out attacks-v7's lazy table, graph epoch counter and stale slots, session 30)."""
from __future__ import annotations

import pytest
import torch

import verify_fakes as fakes
from specgen.spec import load_spec
from specgen.verify import checks, engine
from specgen.verify.engine import Options, run_verification
from specgen.verify.strategies import classes_at_scale, fewer_rows_case, full_size_cases, large_case

QUICK = Options(examples=3, budget=1 << 13, seed=1, endurance=0)
TAG = 0x5EC0DE5EC0DE


@pytest.fixture(scope="module")
def gelu():
    from conftest import SPECS

    return load_spec(SPECS / "gelu_tanh.yaml")


class LazyTable(fakes.PyKernel):
    """Builds its table on the first call, enqueued behind that call's stream (a second launch of
    the first call); a call that runs before it finds zeros."""

    def __init__(self, spec):
        super().__init__(spec, self.forward)
        self.table = None

    def steps(self, direction, tensors, scalars, dims):
        if direction != "forward":
            return [lambda: self.call(direction, tensors, scalars, dims, None)]
        if self.table is None and not getattr(self, "building", False):
            self.building = True

            def build():
                self.table = torch.ones(1)
            return [lambda: 0, build, lambda: self.compute(tensors)]
        return [lambda: self.compute(tensors)]

    def compute(self, t):
        scale = self.table if self.table is not None else torch.zeros(1)
        t["out"].copy_((fakes._gelu(t["x"]).float() * scale).to(t["out"].dtype))
        return 0

    @staticmethod
    def forward(k, t, dims):
        for step in k.steps("forward", t, {}, dims):
            step()


def tag_skips(k, t, dims):
    """Trusts its own tag in the workspace: a call that finds it there returns without writing
    (as a graph's epoch counter that finds the previous replay's count)."""
    tag = t["workspace"][:8].view(torch.int64)
    if int(tag[0]) == TAG:
        return 0
    t["out"].copy_(fakes._gelu(t["x"]))
    tag.fill_(TAG)
    return 0


def test_a_table_built_lazily_on_the_first_calls_stream_is_rejected(gelu):
    verdict = run_verification(gelu, LazyTable(gelu), QUICK, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert "first calls" in verdict.detail


def test_without_the_first_calls_check_the_lazy_table_passes(gelu, monkeypatch):
    monkeypatch.setattr(engine, "check_first_calls", lambda *a, **k: None)
    verdict = run_verification(gelu, LazyTable(gelu), QUICK, device="cpu")
    assert verdict.passed, verdict.summary()


def calls_after_starved_ones_off(monkeypatch) -> None:
    """(version 16) The calls after a starved one share a workspace between two shapes in one thread
    (starved.check_calls_after), which a trusted tag also fails: off where a test names the check."""
    from specgen.verify import starved

    monkeypatch.setattr(starved, "check_calls_after", lambda *a, **k: None)


def test_a_tag_trusted_in_the_workspace_fails_the_kept_replays(gelu, monkeypatch):
    calls_after_starved_ones_off(monkeypatch)
    kernel = fakes.WorkspaceKernel(gelu, tag_skips, lambda dims: 64)
    verdict = run_verification(gelu, kernel, QUICK, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert "replayed from its CUDA graph again" in verdict.detail


def test_a_tag_trusted_in_the_workspace_fails_after_a_larger_call(gelu, monkeypatch):
    calls_after_starved_ones_off(monkeypatch)
    monkeypatch.setattr(checks, "check_replays_keeping_workspace", lambda *a, **k: None)
    kernel = fakes.WorkspaceKernel(gelu, tag_skips, lambda dims: 64)
    verdict = run_verification(gelu, kernel, QUICK, device="cpu")
    assert verdict.reason == "wrong-result", verdict.summary()
    assert "right after a call on more rows" in verdict.detail


def test_without_the_kept_workspace_checks_the_tag_passes(gelu, monkeypatch):
    calls_after_starved_ones_off(monkeypatch)
    monkeypatch.setattr(checks, "check_replays_keeping_workspace", lambda *a, **k: None)
    monkeypatch.setattr(engine, "check_on_the_workspace_left", lambda *a, **k: None)
    # (each thread's 200 calls in a row keep their workspace too, as the endurance run's do)
    monkeypatch.setattr(engine, "check_calls_from_threads", lambda *a, **k: None)
    kernel = fakes.WorkspaceKernel(gelu, tag_skips, lambda dims: 64)
    verdict = run_verification(gelu, kernel, QUICK, device="cpu")
    assert verdict.passed, verdict.summary()


def test_honest_workspace_kernels_pass_the_kept_workspace_checks(gelu):
    kernel = fakes.WorkspaceKernel(gelu, fakes.gelu_via_workspace, lambda dims: 4 * dims["N"] * dims["D"])
    verdict = run_verification(gelu, kernel, QUICK, device="cpu")
    assert verdict.passed, verdict.summary()


def test_the_fewer_rows_case_keeps_the_row_and_cuts_the_rest(gelu):
    big = large_case(gelu, 1 << 16, seed=3)
    fewer = fewer_rows_case(gelu, big)
    assert fewer is not None and fewer.dim_map["D"] == big.dim_map["D"]
    assert fewer.dim_map["N"] < big.dim_map["N"] and fewer.dim_map["N"] >= gelu.dims["N"][0]


def test_classes_at_scale_take_the_first_benchmark_shape_in_each_class(gelu):
    from specgen.verify.strategies import EVERY_CLASS

    first = full_size_cases(gelu, seed=5)[0]
    cases = classes_at_scale(gelu, [first], EVERY_CLASS, seed=9)
    assert {c.distribution for c in cases} >= {"specials", "huge", "masked"}
    assert all(c.dim_map == first.dim_map for c in cases)
    assert len({c.dtype for c in cases}) == min(len(cases), len(gelu.dtypes))
