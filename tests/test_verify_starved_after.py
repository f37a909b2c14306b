"""The call with no GPU memory left, widened, and the calls after it (specgen/verify/starved.py, version 16).

Held-out attacks-v11's softmax_a takes pool scratch only for rows wider than 32768 (never at the smoke
shape, the only place the starved call ran), returns the allocation's error correctly, and leaves its
plan table's std::mutex locked on that path: every later call of the process blocks forever in lock().
The starved call now runs at the widest row and with many rows too, and each is followed by normal
calls from the request thread and from another host thread, which must finish within the watch. On the
CPU the stand-ins' locks are Python locks and the stand-in runner's requests get a short watch of their
own (starved.Watched, LOCAL_WATCH_S lowered here); the candidate's process has its own (45 s) on a GPU.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace

import pytest
import torch

import verify_fakes as fakes
from conftest import SPECS
from specgen.spec import load_spec
from specgen.verify import starved
from specgen.verify.data import prepare
from specgen.verify.dirty_pool import pool_of
from specgen.verify.engine import Options, run_verification
from specgen.verify.isolation import LocalRunner
from specgen.verify.strategies import smoke_case
from specgen.verify.verdict import Failure

QUICK = Options(examples=3, budget=1 << 13, seed=1, endurance=0, directions=("forward",))
WATCH_S = 3.0
GIVE_UP_S = 4 * WATCH_S  # a stand-in blocked on the lock gives up then (std::mutex would wait forever)
SPLIT_ABOVE = 32768  # softmax_a's: wider rows are split over blocks with pool scratch


@pytest.fixture(autouse=True)
def short_watch(monkeypatch):
    monkeypatch.setattr(starved, "LOCAL_WATCH_S", WATCH_S)


@pytest.fixture(scope="module")
def softmax():
    return load_spec(SPECS / "softmax.yaml")


def _softmax(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


class PlanLockSoftmax(fakes.PyKernel):
    """softmax_a's host code as a stand-in: a plan lock around every forward; rows wider than
    SPLIT_ABOVE take scratch from the pool. `raii`: the lock is held by a guard (released on every
    path); else lock()/unlock() with the failed allocation's return in between. `lock` the kind of
    mutex (threading.RLock: a recursive one, which its own thread may take again)."""

    def __init__(self, spec, raii: bool, lock=threading.Lock):
        super().__init__(spec, self.forward)
        self.plan_lock, self.raii, self.failed = lock(), raii, 0

    @staticmethod
    def forward(k, t, dims):
        if k.raii:
            with k.plan_lock:
                return k.compute(t, dims)
        if not k.plan_lock.acquire(timeout=GIVE_UP_S):  # (the test process's stuck thread ends, long after the
            return 999                                   # watch reported it: its kernel_running count drops)
        code = k.compute(t, dims)
        if code == 0:  # unlock() on the paths that got their scratch (or needed none) only
            k.plan_lock.release()
        return code

    def error_name(self, code: int) -> str:
        return "cudaErrorMemoryAllocation" if code == 2 else super().error_name(code)

    def compute(self, t, dims) -> int:
        if dims["D"] > SPLIT_ABOVE:
            scratch = pool_of(self).malloc(dims["N"] * 16 * 8)  # (max, sum) per chunk of each row
            if scratch is None:
                self.failed += 1
                return 2  # cudaErrorMemoryAllocation, reported right
            pool_of(self).free(scratch)
        t["out"].copy_(_softmax(t["x"]))
        return 0


def session_for(spec, kernel, budget: int = 1 << 13):
    """What check_starved_calls asks of engine.Session, for a stand-in on the CPU."""
    runner = LocalRunner(spec, kernel, "cpu")
    done = []
    return SimpleNamespace(spec=spec, runner=runner, options=SimpleNamespace(seed=1, budget=budget),
                           progress=lambda text: None, not_run=lambda where, why: done.append((where, why)),
                           prepare=lambda case, direction: prepare(spec, case, direction, "cpu"), skipped=done)


# ------------------------------------------------------------------ the cases

def test_the_starved_call_runs_at_the_smoke_shape_the_widest_row_and_many_rows(softmax):
    cases = starved.starved_cases(softmax, 1, 1 << 13)
    assert [c.dim_map for c in cases] == [smoke_case(softmax, 1).dim_map, {"N": 4, "D": 131072},
                                          {"N": 40961, "D": 8}]
    assert cases[1].dim_map["D"] > SPLIT_ABOVE  # past softmax_a's split: where its allocation is
    rope = load_spec(SPECS / "rope.yaml")  # S only up to 32768: no case past SPLIT_ROWS
    shapes = [c.dim_map for c in starved.starved_cases(rope, 1, 1 << 20)]
    assert len(shapes) == 2 and shapes[1]["D"] == rope.dims["D"][1]


# ------------------------------------------------------------------ the watch of a stand-in runner

def test_a_request_that_never_returns_is_a_timeout_and_so_is_every_later_one(softmax):
    runner = starved.Watched(LocalRunner(softmax, fakes.PyKernel(softmax, fakes.gelu_forward), "cpu"))
    gate = threading.Event()
    started = time.monotonic()
    outcome = runner.request(gate.wait)
    assert outcome.timeout and "no answer within 3 s" in outcome.fatal
    assert WATCH_S <= time.monotonic() - started < WATCH_S + 5
    assert runner.request(lambda: 1).timeout  # the request thread is still stuck: no later call is made
    gate.set()
    fresh = starved.Watched(runner.runner)
    assert fresh.request(threading.get_ident) != threading.get_ident()  # its own request thread
    fresh.close()


# ------------------------------------------------------------------ the check, on CPU stand-ins

def test_a_lock_left_held_after_a_failed_allocation_is_a_hang_after_it(softmax):
    kernel = PlanLockSoftmax(softmax, raii=False)
    session = session_for(softmax, kernel)
    started = time.monotonic()
    with pytest.raises(Failure) as caught:
        starved.check_starved_calls(session, "forward", smoke_case(softmax, 1))
    assert time.monotonic() - started < 60  # one short watch, not a hung test
    failure = caught.value
    assert failure.reason == "timeout" and failure.fatal
    assert "after a call whose allocation failed (softmax_forward on N=4 D=131072" in failure.detail
    assert "returned cudaErrorMemoryAllocation" in failure.detail
    assert "later calls of softmax_forward never finished: a later call from the same host thread" in failure.detail
    assert "RAII" in failure.detail and "std::lock_guard" in failure.detail
    assert kernel.failed == 1  # the smoke shape's starved call allocated nothing: the widest row's failed


def test_a_lock_released_on_every_path_passes(softmax):
    kernel = PlanLockSoftmax(softmax, raii=True)
    session = session_for(softmax, kernel)
    made = starved.check_starved_calls(session, "forward", smoke_case(softmax, 1))
    assert made == 3 * (1 + 2 * 2)  # three starved calls, each followed by two cases from two threads
    assert kernel.failed == 1 and not session.skipped
    assert kernel.plan_lock.acquire(blocking=False)  # nothing left held


def test_a_recursive_lock_left_held_hangs_only_the_other_thread(softmax):
    """A std::recursive_mutex left locked: the thread that failed may take it again; another may not."""
    kernel = PlanLockSoftmax(softmax, raii=False, lock=threading.RLock)
    session = session_for(softmax, kernel)
    with pytest.raises(Failure) as caught:
        starved.check_starved_calls(session, "forward", smoke_case(softmax, 1))
    assert caught.value.reason == "timeout"
    assert "never finished: later calls from another host thread" in caught.value.detail


def test_a_wrong_result_after_a_failed_allocation_is_rejected(softmax):
    """After a failed allocation the plan stays marked "split" for the shape, and later calls of that
    shape compute the first chunk of each row only."""
    def forward(k, t, dims):
        if dims["D"] > SPLIT_ABOVE and getattr(k, "allocations_fail", False):
            k.broken = True
            return 2
        t["out"].copy_(_softmax(t["x"]))
        if getattr(k, "broken", False) and dims["D"] > SPLIT_ABOVE:
            t["out"][:, 4096:] = 0
        return 0
    session = session_for(softmax, fakes.PyKernel(softmax, forward))
    with pytest.raises(Failure) as caught:
        starved.check_starved_calls(session, "forward", smoke_case(softmax, 1))
    assert caught.value.reason == "wrong-result"
    assert caught.value.detail.startswith("after a call whose allocation failed (softmax_forward on N=4 D=131072")
    assert "a later call from the same host thread on N=4 D=131072" in caught.value.detail


# ------------------------------------------------------------------ through the engine

def test_the_engine_rejects_the_held_lock_and_passes_the_guarded_one(softmax):
    verdict = run_verification(softmax, PlanLockSoftmax(softmax, raii=False), QUICK, device="cpu")
    assert verdict.reason == "timeout", verdict.summary()
    assert "after a call whose allocation failed" in verdict.detail and "RAII" in verdict.detail
    honest = PlanLockSoftmax(softmax, raii=True)
    verdict = run_verification(softmax, honest, dataclasses.replace(QUICK, full_size=False), device="cpu")
    assert verdict.reason == "passed", verdict.summary()
    assert honest.failed == 1  # its one failed allocation: the widest row's starved call
