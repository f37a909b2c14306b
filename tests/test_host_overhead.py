"""benchmarks/host_overhead.py without a GPU: it says it needs one (exit 3) and measures nothing;
its table and the ratio it reports, from rows made here (no GPU needed)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import host_overhead  # noqa: E402


def test_without_a_gpu_it_says_so_and_exits_3(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert host_overhead.main(["--package", "no_such_package_here"]) == 3
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_table_marks_rows_over_the_target(capsys):
    rows = [{"op": "softmax", "direction": "forward", "rows": 1, "ours_us": 9.0,
             "eager_us": {"torch.softmax": 8.0}, "ratio": 9.0 / 8.0, "compiled_ours_us": None, "meets_target": True},
            {"op": "rmsnorm", "direction": "forward+backward", "rows": 8, "ours_us": 200.0,
             "eager_us": {"rmsnorm in torch ops": 120.0, "F.rms_norm": 100.0}, "ratio": 2.0,
             "compiled_ours_us": None, "meets_target": False}]
    host_overhead.print_table(rows)
    out = capsys.readouterr().out
    assert "1.12x" in out and "2.00x" in out and "NO" in out and "F.rms_norm 100.0" in out
