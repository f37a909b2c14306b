"""Autotuning on a real GPU: `specgen generate` tunes a spec in a temporary copy, records the
variant and its timings in the lock, and a second run reuses them without verifying or
timing anything (the real backend's GPU calls are made to fail on the second run)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specgen import cli, lock
from specgen.agents.builtin import tune
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.slow
def test_generate_tunes_on_the_gpu_records_the_variant_and_reuses_it(tmp_path, monkeypatch, capsys):
    shutil.copy(SPECS / "gelu_tanh.yaml", tmp_path / "gelu_tanh.yaml")
    path = tmp_path / "gelu_tanh.yaml"
    code = cli.main(["generate", str(path), "--tune-budget", "60"])
    out = capsys.readouterr().out
    print(out)
    spec = load_spec(path)
    entry = lock.Lock.for_spec(spec).entry("gelu_tanh")
    tuning = entry.tuning
    assert tuning is not None, out
    assert tuning["key"] == tune.tuning_key(spec, tuning["key"]["gpu_arch"])
    assert tuning["key"]["gpu_arch"].startswith("sm_")
    tried = {name: v for name, v in tuning["variants"].items() if "skipped" not in v}
    assert "default" in tried and tried[tuning["variant"]]["verified"]
    assert all(v["verified"] or "not needed" in v.get("verification", "") for v in tried.values() if v.get("rows"))
    rows = len(spec.benchmark) * len(spec.dtypes) * 2  # forward and backward
    assert all(len(v["rows"]) == rows and all(r["kernel_us"] > 0 for r in v["rows"])
               for v in tried.values() if v.get("rows"))
    assert len(tuning["rows"]) == rows and all(r["eager_us"] > 0 for r in tuning["rows"])
    assert "chosen: variant" in out and "decision:" in out
    if tuning["decision"] == tune.KERNEL:
        assert code == 0 and entry.kernel
        (record,) = entry.records
        assert record.passed and record.verification["variant"] == tuning["variant"]
        source = (tmp_path / "kernels" / "gelu_tanh.cu").read_text()
        assert f"// Schedule variant: {tuning['variant']}." in source
    else:  # the GPU found eager faster on some row: the reference path, with its numbers
        assert code == 1 and not entry.kernel and "slower than eager" in entry.reference

    def no_gpu(*_, **__):
        raise AssertionError("the second run should reuse the tuning, not verify or time")

    for name in ("prepare", "verify", "time_kernel", "time_eager", "benchmark"):
        monkeypatch.setattr(tune.GpuBackend, name, no_gpu)
    assert cli.main(["generate", str(path)]) == code
    assert "tuning reused from the lock" in capsys.readouterr().out
    assert lock.Lock.for_spec(spec).entry("gelu_tanh").created == entry.created
