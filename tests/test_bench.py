"""The benchmark: bytes from the signature, roofline arithmetic, the CLI; timing on the GPU."""
from __future__ import annotations

import json

import pytest

from conftest import SPECS
from specgen.bench import BenchRow, moved_bytes
from specgen.cli import main
from specgen.commands.bench import parse_shape, results_table
from specgen.errors import UsageError
from specgen.spec import load_spec


def test_bytes_moved_count_every_input_and_output_once():
    rms = load_spec(SPECS / "rmsnorm.yaml")
    # x (N*D) + weight (D) in, out (N*D) written; bf16 = 2 bytes
    assert moved_bytes(rms, {"N": 4, "D": 8}, "bfloat16") == (32 + 8 + 32) * 2
    ce = load_spec(SPECS / "cross_entropy.yaml")
    # logits N*C in the working dtype, target N int64, a float32 0-d loss
    assert moved_bytes(ce, {"N": 3, "C": 10}, "float16") == 30 * 2 + 3 * 8 + 4
    swiglu = load_spec(SPECS / "swiglu.yaml")
    assert moved_bytes(swiglu, {"N": 2, "H": 5}, "float32") == (2 * 10 + 2 * 5) * 4


def test_row_ratios_and_roofline_fraction():
    row = BenchRow("op", {"N": 1}, "float32", bytes=2_000_000, roofline_us=1.0, copy_gbs=2000.0,
                   kernel_us=2.0, eager_us=6.0, compile_us=3.0)
    data = row.as_dict()
    assert data["kernel_gbs"] == pytest.approx(1000.0)
    assert data["kernel_roofline_fraction"] == pytest.approx(0.5)
    assert data["speedup_vs_eager"] == pytest.approx(3.0)
    assert data["speedup_vs_compile"] == pytest.approx(1.5)
    assert data["baseline_gbs"] is None
    table = results_table(type("R", (), {"op": "op", "device": "H200", "copy_gbs": 2000.0, "rows": [row]})())
    assert table.row_count == 1 and len(table.columns) == 10


def test_parse_shape():
    assert parse_shape("N=4,D=8", ["N", "D"]) == {"N": 4, "D": 8}
    with pytest.raises(UsageError, match="no size for D"):
        parse_shape("N=4", ["N", "D"])
    with pytest.raises(UsageError, match="SYMBOL=SIZE"):
        parse_shape("Q=4", ["N", "D"])


def test_bench_without_a_gpu_exits_3(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench", str(SPECS / "gelu_tanh.yaml"), "--no-compile"]) == 3
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_time_callable_and_copy_bandwidth():
    import torch

    from specgen.bench import copy_bandwidth_gbs, time_callable

    x = torch.randn(1 << 24, device="cuda")
    stats = time_callable(lambda: x.mul_(1.0), reps=10)
    assert 0 < stats.min_ms <= stats.median_ms <= stats.max_ms
    assert 100 < copy_bandwidth_gbs() < 20000  # GB/s: any real GPU


@pytest.mark.gpu
@pytest.mark.nvcc
def test_bench_spec_times_kernel_eager_and_compile_side_by_side(tmp_path):
    from verify_support import GOOD, record

    out = tmp_path / "bench.json"
    code = main(["bench", str(SPECS / "gelu_tanh.yaml"), "--kernel", str(GOOD / "gelu_tanh.cu"),
                 "--shape", "N=4096,D=4096", "--dtype", "bfloat16", "--reps", "10", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    row = data["rows"][0]
    record("bench_test", "gelu_tanh", row)
    for key in ("kernel_us", "eager_us", "compile_us"):
        assert row[key] and row[key] > 0, (key, row)
    assert 0 < row["kernel_roofline_fraction"] <= 1.05  # above the copy roofline is a bug
