"""scripts/gpu_stages/pack.sh, last stage of a GPU call: everything under $OUT in one call.tgz
beside a short summary.txt (the device tool brings back few files)."""
from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

PACK = Path(__file__).resolve().parent.parent / "scripts" / "gpu_stages" / "pack.sh"


def test_pack_leaves_one_tarball_and_a_summary_of_the_stages(tmp_path):
    out = tmp_path / "out"
    (out / "level1" / "dev").mkdir(parents=True)
    (out / "gputests").mkdir()
    (out / "environment.txt").write_text("== environment\nNVIDIA H200, 9.0, 143771 MiB\n")
    (out / "console.log").write_text("== stage gputests (results under x)\ngputests: process 0 (3 tests): 1 failed, 2 passed\n"
                                     "FAILED tests/t.py::test_a\nnoise line\n== stage gputests: exit 1 in 9 s\n")
    (out / "gputests" / "gpu-tests-0.log").write_text("log body\n")
    (out / "level1" / "dev.log").write_text("[level1] spec a: verified\n| lowered | PASS |\n")
    (out / "level1" / "dev" / "level1_bench.json").write_text("{}")
    subprocess.run(["bash", str(PACK)], env={**os.environ, "OUT": str(out)}, check=True, capture_output=True)
    assert sorted(p.name for p in out.iterdir()) == ["call.tgz", "summary.txt"]
    summary = (out / "summary.txt").read_text()
    assert "NVIDIA H200" in summary and "1 failed, 2 passed" in summary and "FAILED tests/t.py::test_a" in summary
    assert "== stage gputests: exit 1" in summary and "| lowered | PASS |" in summary
    assert "noise line" not in summary and "[level1] spec a" not in summary
    with tarfile.open(out / "call.tgz") as tar:
        names = {n.lstrip("./") for n in tar.getnames()}
    assert {"gputests/gpu-tests-0.log", "level1/dev/level1_bench.json", "console.log", "environment.txt"} <= names


def test_pack_without_out_touches_nothing(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(["bash", str(PACK)], env=env, cwd=tmp_path, capture_output=True)
    assert done.returncode != 0 and keep.read_text() == "mine"


def test_a_failed_tar_deletes_nothing(tmp_path):
    """A full disk (tar fails) must not lose the call's results (session 25 review)."""
    out = tmp_path / "out"
    (out / "level1").mkdir(parents=True)
    (out / "level1" / "dev.log").write_text("result\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "tar").write_text("#!/bin/sh\nexit 2\n")
    (fake / "tar").chmod(0o755)
    env = {**os.environ, "OUT": str(out), "PATH": f"{fake}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(PACK)], env=env, capture_output=True)
    assert done.returncode != 0
    assert (out / "level1" / "dev.log").read_text() == "result\n" and not (out / "call.tgz").exists()


def test_a_relative_out_packs_that_folder_only(tmp_path):
    """OUT relative to the caller's folder: resolved once (it named a sibling folder before)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.log").write_text("a\n")
    (tmp_path / "sibling").mkdir()
    (tmp_path / "sibling" / "keep.txt").write_text("mine")
    subprocess.run(["bash", str(PACK)], env={**os.environ, "OUT": "out"}, cwd=tmp_path, check=True, capture_output=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["call.tgz", "summary.txt"]
    assert (tmp_path / "sibling" / "keep.txt").read_text() == "mine"
