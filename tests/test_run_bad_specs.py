"""The held-out bad-spec runner (heldout/run_bad_specs.py) gives its child process this checkout's
specgen whether or not it is installed: on a fresh clone every row was "No module named specgen",
rejected for the wrong reason (session 37's first run of bad_specs-v3, thrown away and run again)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _runner():
    spec = importlib.util.spec_from_file_location("run_bad_specs", REPO / "heldout" / "run_bad_specs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_child_finds_this_checkouts_specgen_without_an_install(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(tmp_path)
    runner = _runner()
    assert runner._env()["PYTHONPATH"].split(":")[0] == str(REPO)
    bad = tmp_path / "typo_dtype.yaml"
    bad.write_text("# expect-mention: dtypes\n" + (REPO / "tests" / "builtin_specs" / "abs_gain_rows.yaml")
                   .read_text().replace("dtypes: [float32, bfloat16]", "dtypes: [float32, bfloat61]"))
    row = runner.run_one(bad)
    assert "No module named" not in row["message"], row["message"]
    assert row["rejected"] and row["names_file"] and row["untouched"], row
