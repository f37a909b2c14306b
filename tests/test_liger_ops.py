"""benchmarks/liger_ops.py without a GPU: every op's candidates compute the same function (a
package made of the specs' references stands in for ours), the verdict and the table."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import liger_ops  # noqa: E402
from specgen.spec import load_spec  # noqa: E402


def _reference_package():
    ops = {}
    for op in liger_ops.DEFAULT_OPS.split(","):
        fn = load_spec(REPO / "specs" / f"{op}.yaml").reference_fn()
        ops[op] = fn
    return SimpleNamespace(**ops)


@pytest.mark.parametrize("op", liger_ops.DEFAULT_OPS.split(","))
def test_ours_and_eager_compute_the_same_function(op):
    torch.manual_seed(0)
    case = liger_ops.cases(_reference_package(), op, 6, 256, torch.float32, dev="cpu")
    args = [make(False) for make in case["inputs"]]
    ours, eager = case["candidates"]["ours"](args), case["candidates"]["eager"](args)
    ours, eager = (r if isinstance(r, tuple) else (r,) for r in (ours, eager))
    assert len(ours) == len(eager)
    for a, b in zip(ours, eager):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-5)
    assert set(case["candidates"]) == {"ours", "eager", "liger"}


def test_an_op_the_package_lacks_is_skipped_and_an_unknown_one_is_an_error():
    assert liger_ops.cases(SimpleNamespace(), "softmax", 2, 8, torch.float32, dev="cpu") is None
    with pytest.raises(ValueError, match="no case for 'gelu'"):
        liger_ops.cases(SimpleNamespace(gelu=None), "gelu", 2, 8, torch.float32, dev="cpu")


def test_the_verdict_allows_noise_and_names_who_is_faster():
    assert liger_ops.verdict({"ours": 10.2, "liger": 10.0, "compile": 20.0}) == "ok"  # within 3%
    assert liger_ops.verdict({"ours": 11.0, "liger": 10.0, "compile": 10.5}) == "SLOWER than liger and compile"
    assert liger_ops.verdict({"ours": 9.0, "liger": None, "compile": 8.0}) == "SLOWER than compile"
    assert liger_ops.verdict({"ours": None, "liger": 1.0}) == "not measured"
    rows = [{"op": "softmax", "direction": "forward", "shape": "8x4096", "dtype": "bfloat16",
             "us": {"ours": 5.0, "liger": 10.0, "compile": 4.0, "eager": 6.0}, "verdict": "SLOWER than compile"}]
    text = liger_ops.table(rows)
    assert "| softmax | forward | 8x4096 | bfloat16 | 5.0 | 10.0 | 4.0 | 6.0 | 2.00 | 0.80 | SLOWER than compile |" in text
    assert "0/1 rows" in text
    assert liger_ops.parse_shapes("8x4096,16x2") == [(8, 4096), (16, 2)]
    with pytest.raises(SystemExit, match="ROWSxHIDDEN"):
        liger_ops.parse_shapes("8by4096")
