"""heldout/attacks-v2: the manifest and the kernel files agree, and every kernel compiles.

The held-out suite itself runs on a GPU (heldout/run_attacks_v2.py); here, on the CPU, only
its bookkeeping: every .cu is listed and every listed file exists, each file's header says
what the manifest says, every expected reason is one of the verifier's reason names, and
each kernel passes the static checks (compile, symbols, entry points), except those the
manifest expects the symbol check to refuse, which must be refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgen.verify.verdict import FORBIDDEN_SYMBOL, PASSED, REASONS

REPO = Path(__file__).resolve().parent.parent
FOLDER = REPO / "heldout" / "attacks-v2"
MANIFEST = json.loads((FOLDER / "manifest.json").read_text())
ENTRIES = MANIFEST["kernels"]


def _header(path: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("//"):
            break
        key, sep, value = line[2:].partition(":")
        if sep and key.strip() in ("spec", "expect", "class", "reason") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def test_every_file_listed_once_and_every_listed_file_present():
    listed = [e["file"] for e in ENTRIES]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    present = {p.name for p in FOLDER.glob("*.cu")}
    assert present - set(listed) == set(), f"kernels missing from the manifest: {sorted(present - set(listed))}"
    assert set(listed) - present == set(), f"listed but missing: {sorted(set(listed) - present)}"


def test_expected_outcomes_and_reasons_are_real():
    for e in ENTRIES:
        assert e["expect"] in ("reject", "pass"), e
        assert e["reasons"], e
        for reason in e["reasons"]:
            assert reason in REASONS, f"{e['file']}: {reason!r} is not a verifier reason"
        if e["expect"] == "pass":
            assert e["reasons"] == [PASSED], e
            assert not e["static_refusal"], e
        else:
            assert PASSED not in e["reasons"], e
        if e["static_refusal"]:
            assert FORBIDDEN_SYMBOL in e["reasons"], e
        assert (FOLDER / "specs" / f"{e['spec']}.yaml").exists(), f"{e['file']}: no spec {e['spec']}"


def test_suite_size_and_spread():
    cheats = [e for e in ENTRIES if e["expect"] == "reject"]
    controls = [e for e in ENTRIES if e["expect"] == "pass"]
    assert len(cheats) >= 20 and len(controls) >= 4
    assert len({e["spec"] for e in ENTRIES}) >= 4


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_file_header_matches_manifest(entry):
    fields = _header(FOLDER / entry["file"])
    assert fields.get("spec") == entry["spec"]
    assert fields.get("class") == entry["class"]
    assert fields.get("expect") == {"reject": "rejected", "pass": "passed"}[entry["expect"]]
    assert [r.strip() for r in fields.get("reason", "").split("|")] == entry["reasons"]
    assert entry["file"].startswith(entry["spec"] + "_")


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_kernel_compiles_and_static_checks_as_expected(entry):
    from specgen.spec import load_spec
    from specgen.verify import static_checks

    spec = load_spec(FOLDER / "specs" / f"{entry['spec']}.yaml")  # the spec the suite was written against
    verdict, compiled = static_checks(spec, FOLDER / entry["file"], arch="sm_90")
    if entry["static_refusal"]:
        assert verdict is not None and verdict.reason == FORBIDDEN_SYMBOL, verdict
    elif entry["expect"] == "pass" or verdict is None:  # a control always reaches the GPU checks
        assert verdict is None, verdict.summary()
        assert compiled is not None and Path(compiled.library).exists()
    else:  # a cheat the static checks now refuse (its own streams, a capture query) is caught earlier
        assert verdict.reason in {*entry["reasons"], "stream-violation", FORBIDDEN_SYMBOL}, verdict.summary()
