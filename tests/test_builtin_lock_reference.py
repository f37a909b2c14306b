"""Lock.write_reference: an op that keeps its reference path has a lock entry with the
reason, survives other writers, and is replaced by a kernel entry once a kernel exists."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specgen import lock as lockmod
from specgen.lock import FRESH, Lock
from specgen.package.reference_lock import reference_state
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.fixture
def specs(tmp_path):
    for name in ("linear_bias_relu", "gelu_tanh"):
        shutil.copy(SPECS / f"{name}.yaml", tmp_path / f"{name}.yaml")
    return {name: load_spec(tmp_path / f"{name}.yaml") for name in ("linear_bias_relu", "gelu_tanh")}


def test_reference_entry_keeps_its_reason_across_other_writers(specs, tmp_path):
    matmul, gelu = specs["linear_bias_relu"], specs["gelu_tanh"]
    assert Lock.for_spec(matmul).write_reference(matmul, "builtin", "the builtin agent refused:\n  a matmul")
    lockmod.write_kernel(gelu, "/* kernel */\n", agent="builtin")  # another writer rewrites the file
    lock = Lock.load(tmp_path)
    entry = lock.entry("linear_bias_relu")
    assert entry.kernel == "" and entry.reference == "the builtin agent refused: a matmul"
    assert reference_state(lock, matmul) == (True, "the builtin agent refused: a matmul")
    raw = json.loads((tmp_path / "specgen.lock").read_text())["ops"]
    assert raw["linear_bias_relu"]["reference"].startswith("the builtin agent refused")
    assert "reference" not in raw["gelu_tanh"]  # kernel entries keep the old layout


def test_reference_entry_goes_stale_with_the_spec(specs, tmp_path):
    matmul = specs["linear_bias_relu"]
    lockmod.write_reference(matmul, "builtin", "refused")
    path = tmp_path / "linear_bias_relu.yaml"
    path.write_text(path.read_text().replace("A linear layer", "A dense layer"))
    assert reference_state(Lock.load(tmp_path), load_spec(path))[0] is False


def test_reference_never_replaces_a_kernel_file_and_a_kernel_replaces_the_reference(specs, tmp_path):
    gelu = specs["gelu_tanh"]
    lockmod.write_reference(gelu, "openai", "nothing beat eager")
    assert Lock.load(tmp_path).entry("gelu_tanh").reference == "nothing beat eager"
    lockmod.write_kernel(gelu, "/* kernel */\n", agent="builtin")
    entry = Lock.load(tmp_path).entry("gelu_tanh")
    assert entry.reference is None and Lock.load(tmp_path).status(gelu).state == FRESH
    assert lockmod.write_reference(gelu, "openai", "refused") is False  # the kernel file stays in charge
    assert Lock.load(tmp_path).entry("gelu_tanh").kernel == "kernels/gelu_tanh.cu"
