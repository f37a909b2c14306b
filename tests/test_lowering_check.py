"""benchmarks/lowering_check.py: a suite's lowering counted and checked on the CPU interpreter."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import lowering_check  # noqa: E402

from specgen.spec import load_spec  # noqa: E402

DEV = REPO / "benchmarks" / "level1" / "specs"
REDUCE = Path(__file__).resolve().parent / "reduce_specs"
STAGED = Path(__file__).resolve().parent / "staged_specs" / "router_balance.yaml"


def test_a_suite_is_counted_and_a_held_out_summary_names_no_problem(tmp_path, capsys):
    suite = tmp_path / "suite"
    suite.mkdir()
    for path in (DEV / "hardsigmoid.yaml", DEV / "amax_last.yaml", REDUCE / "sum_dims13.yaml", STAGED):
        shutil.copy(path, suite / path.name)  # three that lower (one in stages), one the family refuses
    out = tmp_path / "lc.json"
    assert lowering_check.main(["--specs", str(suite), "--json", str(out), "--summary-only"]) == 0
    printed = capsys.readouterr().out
    assert "3 of 4 lowered (1 refused, 0 errors); 3 of 3 lowered specs match in every direction" in printed
    assert "1 lowered in stages, 1 of them matching" in printed
    assert not any(name in printed for name in ("hardsigmoid", "amax_last", "sum_dims13", "router_balance"))
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["router_balance"]["stages"] == {"forward": 2, "backward": 2}
    assert rows["sum_dims13"]["state"] == "refused" and "dims [1, 3]" in rows["sum_dims13"]["message"]
    # hardsigmoid's backward multiplies by a float32 1/6: within the check's tolerance, not a mismatch
    assert rows["hardsigmoid"]["checks"] == {"forward": "match", "backward": "match"}
    assert data["summary"]["by_family"]["pointwise"] == {"specs": 1, "lowered": 1, "matched": 1}


def test_a_wrong_lowering_is_a_mismatch():
    """The check can fail: gelu's reference against relu's lowered programs (the same signature)."""
    from specgen.agents.builtin.generator import lower_spec

    gelu = load_spec(DEV / "gelu.yaml")
    relu = load_spec(DEV / "relu.yaml")
    checks = lowering_check.check_directions(gelu, lower_spec(relu), seed=0)
    assert checks["forward"].startswith("mismatch at ")


def test_no_spec_found_is_exit_2(tmp_path):
    assert lowering_check.main(["--specs", str(tmp_path)]) == 2


def test_an_output_computed_without_autograd_takes_no_gradient_in_the_cpu_check():
    """A reference whose second output is computed under no_grad (BatchNorm's running statistics):
    autograd.grad refused the whole list ("does not require grad"), so the held-out problems-v9
    BatchNorm's backward was reported `not run`; trace.py already left such outputs out."""
    from builtin_support import own_spec

    from specgen.agents.builtin.cpu_check import check_backward, check_forward

    spec = own_spec("scaled_with_detached_mean")
    for dims in ({"N": 3, "D": 5}, {"N": 1, "D": 1}):
        check_forward(spec, dims)
        check_backward(spec, dims)
