"""Each held-out attack suite is verified against the specs it was written against.

A spec may change after a suite is written: cross_entropy and rmsnorm gained saved row
statistics (a new ABI output the forward must write). Verified against today's spec, every
kernel of an older suite leaves that output unwritten, so every row (controls included) is
decided by the ABI change instead of by its attack. So each suite keeps a copy of its specs in
its own specs/ (taken from git at the suite's first commit), and the runners use it by default.
Only the suites' bookkeeping is read here, no kernel's content.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from specgen.spec import load_spec

HELDOUT = Path(__file__).resolve().parents[1] / "heldout"
SUITES = ["attacks", "attacks-v2", "attacks-v3", "attacks-v4", "attacks-v5", "attacks-v6", "attacks-v7",
          "attacks-v8", "attacks-v9", "attacks-v10"]


def _specs_used(folder: Path) -> set[str]:
    manifest = folder / "manifest.json"
    if manifest.exists():
        return {e["spec"] for e in json.loads(manifest.read_text())["kernels"]}
    used = set()
    for path in folder.glob("*.cu"):
        match = re.search(r"^// spec: (\S+)", path.read_text(), re.M)
        assert match, f"{path}: no '// spec:' line"
        used.add(match.group(1))
    return used


def _runner():
    spec = importlib.util.spec_from_file_location("run_attacks_v2", HELDOUT / "run_attacks_v2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("suite", SUITES)
def test_suite_has_every_spec_it_uses_and_they_load(suite):
    folder = HELDOUT / suite
    used = _specs_used(folder)
    assert used, suite
    own = {p.stem for p in (folder / "specs").glob("*.yaml")}
    assert used <= own, f"{suite}: no snapshot of {sorted(used - own)}"
    for name in used:
        assert load_spec(folder / "specs" / f"{name}.yaml").name == name


def test_runner_uses_a_suites_own_specs():
    runner = _runner()
    assert runner.suite_specs(HELDOUT / "attacks-v2") == HELDOUT / "attacks-v2" / "specs"
    assert runner.suite_specs(HELDOUT) == HELDOUT.parent / "specs"  # a folder without specs/


def test_cross_entropy_snapshot_predates_the_saved_statistic():
    # the reason the snapshots exist: today's spec asks for an output the v2 kernels never write
    today = load_spec(HELDOUT.parent / "specs" / "cross_entropy.yaml")
    then = load_spec(HELDOUT / "attacks-v2" / "specs" / "cross_entropy.yaml")
    assert today.saved and not then.saved


def _verify_suite():
    spec = importlib.util.spec_from_file_location(
        "verify_suite", HELDOUT.parent / "scripts" / "gpu_stages" / "verify_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_verify_stage_uses_the_spec_each_kernel_was_written_against():
    """Session 20 found the GPU stage verifying tests/adversarial's rmsnorm kernels against
    today's rmsnorm (saved rstd): four verdicts were 'unwritten-output' instead of their attack's."""
    suite = _verify_suite()
    repo = HELDOUT.parent
    adversarial = repo / "tests" / "adversarial" / "rmsnorm_fixed_eps.cu"
    assert suite.spec_path_for("rmsnorm", adversarial) == repo / "tests" / "verify_specs" / "rmsnorm.yaml"
    assert not load_spec(suite.spec_path_for("rmsnorm", adversarial)).saved
    held = HELDOUT / "attacks" / "rmsnorm_x.cu"
    assert suite.spec_path_for("rmsnorm", held) == HELDOUT / "attacks" / "specs" / "rmsnorm.yaml"
    committed = repo / "specs" / "kernels" / "rmsnorm.cu"
    assert suite.spec_path_for("rmsnorm", committed) == repo / "specs" / "rmsnorm.yaml"


def test_only_takes_a_whole_file_name_ending_in_cu():
    """attacks-v9's neutral names nest (softmax_a.cu inside log_softmax_a.cu): a name ending in
    .cu selects that file alone, anything else is a substring as before."""
    runner = _runner()
    assert runner.selects("softmax_a.cu", "softmax_a.cu") and not runner.selects("softmax_a.cu", "log_softmax_a.cu")
    assert runner.selects("softmax_a", "log_softmax_a.cu") and runner.selects("control", "softmax_control.cu")
