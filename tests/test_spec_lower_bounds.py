"""Every committed spec (the examples, the level-1 development suite, the tests' own) has a
reference that runs at the lower bound of every dim: the verifier's smallest case. Session 23's
GPU run met three specs whose dims admitted a shape their reference raises on (F.instance_norm
with one spatial element, nn.GroupNorm with one value a group and batch): a SpecError at
verification instead of a verdict."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from specgen.inputs import make_inputs
from specgen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["specs", "benchmarks/level1/specs", "tests/reduce_specs", "tests/builtin_specs", "tests/batch_specs",
           "tests/no_grad_specs", "tests/saved_specs", "tests/verify_specs"]
FILES = sorted(p for folder in FOLDERS for p in (ROOT / folder).glob("*.yaml"))


def _loadable(path: Path):
    try:
        return load_spec(path)
    except Exception:  # noqa: BLE001 - a spec that tests a load error: its own tests cover it
        return None


def test_the_folders_hold_specs():
    assert sum(_loadable(p) is not None for p in FILES) >= 150


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_reference_runs_at_the_lower_bounds(path):
    spec = _loadable(path)
    if spec is None:
        pytest.skip("not a loadable spec (a load-error case)")
    dims = {name: low for name, (low, _high) in spec.dims.items()}
    args = make_inputs(spec.signature, dims, spec.dtypes[0], seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # var / std of one value: NaN and a warning, as torch says
        spec.reference_fn()(**args)
