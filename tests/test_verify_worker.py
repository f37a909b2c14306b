"""The worker process: warm reuse, a crash or a hang becomes a verdict, a fresh worker after
a crash. Runs on a CPU with Python stand-in kernels (SPECGEN_WORKER_DEVICE=cpu)."""
from __future__ import annotations

import pytest

from conftest import SPECS
from specgen.errors import EnvironmentMissing
from specgen.verify.worker import VerifyWorker

OPTIONS = {"examples": 2, "budget": 1 << 12, "seed": 0}


@pytest.fixture
def cpu_worker(monkeypatch):
    from verify_support import TESTS

    monkeypatch.setenv("SPECGEN_WORKER_DEVICE", "cpu")
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    worker = VerifyWorker(startup_timeout=120)
    yield worker
    worker.close()


def test_a_warm_worker_is_reused_and_a_crash_gets_a_fresh_one(cpu_worker):
    spec = SPECS / "gelu_tanh.yaml"
    progress = []
    first = cpu_worker.verify(spec, "py:verify_fakes:correct", OPTIONS, on_progress=progress.append)
    assert first.passed, first.summary()
    assert any("forward:" in p for p in progress) and any("backward:" in p for p in progress)
    pid = cpu_worker.process.pid
    again = cpu_worker.verify(spec, "py:verify_fakes:correct", OPTIONS)
    assert again.passed and cpu_worker.process.pid == pid  # warm: the same process

    crashed = cpu_worker.verify(spec, "py:verify_fakes:segfaults", OPTIONS)
    assert crashed.reason == "crash" and crashed.fatal
    assert "SIGABRT" in crashed.detail and "N=" in crashed.detail  # how it died, and on which case
    assert not cpu_worker.alive()

    after = cpu_worker.verify(spec, "py:verify_fakes:correct", OPTIONS)
    assert after.passed and cpu_worker.process.pid != pid


def test_a_hang_is_a_timeout_and_a_lost_context_ends_the_worker(cpu_worker):
    spec = SPECS / "gelu_tanh.yaml"
    hung = cpu_worker.verify(spec, "py:verify_fakes:hangs", OPTIONS, idle_timeout=3)
    assert hung.reason == "timeout", hung.summary()
    assert "N=" in hung.detail and not cpu_worker.alive()

    lost = cpu_worker.verify(spec, "py:verify_fakes:lost_context", OPTIONS)
    assert lost.reason == "crash" and lost.fatal
    assert "cudaErrorIllegalAddress" in lost.detail
    assert not cpu_worker.alive()  # reaped: a worker whose CUDA context is lost is never reused


def test_a_slow_step_of_the_judge_is_not_a_hang(cpu_worker, tmp_path):
    """The judge's own work (here the reference's first call, 5 s) beats to the worker's watch
    (heartbeat.py): on a loaded host such steps took past the 60 s watch (session 37, a control
    rejected as `timeout`). A kernel hanging in the same process still times out (the test above)."""
    text = (SPECS / "gelu_tanh.yaml").read_text()
    slow = text.replace("  def reference(x):\n",
                        "  import time\n  _first = [True]\n\n  def reference(x):\n"
                        "      if _first:\n          _first.clear()\n          time.sleep(5)\n")
    assert slow != text
    spec = tmp_path / "gelu_tanh.yaml"
    spec.write_text(slow)
    verdict = cpu_worker.verify(spec, "py:verify_fakes:correct", OPTIONS, idle_timeout=3)
    assert verdict.passed, verdict.summary()


def test_without_a_gpu_the_worker_says_so(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.delenv("SPECGEN_WORKER_DEVICE", raising=False)
    worker = VerifyWorker(startup_timeout=120)
    with pytest.raises(EnvironmentMissing, match="no CUDA GPU"):
        worker.start()
    assert not worker.alive()


def test_the_judge_runs_with_passive_openmp_threads_unless_the_user_says(monkeypatch):
    """Side by side, spinning OpenMP threads starve each other's processes (6 judges' class
    screens on 2 cores: 40 s each spinning, 5 s passive); a user's own OMP_WAIT_POLICY is kept."""
    from specgen.verify.worker import judge_environment

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert judge_environment()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert judge_environment()["OMP_WAIT_POLICY"] == "ACTIVE"
