"""CPU checks of heldout/attacks-v3: the manifest and the files agree (no kernel is read for content)."""
import json
import re
from pathlib import Path

from specgen.verify.verdict import REASONS

FOLDER = Path(__file__).resolve().parents[1] / "heldout" / "attacks-v3"
HEAD = re.compile(r"\A// spec: (\S+)\n// expect: (rejected|passed)\n// class: ([a-z0-9-]+)\n// why: (.+)\n")


def test_manifest_matches_files():
    entries = json.loads((FOLDER / "manifest.json").read_text())["kernels"]
    files = {p.name: p for p in FOLDER.glob("*.cu")}
    assert {e["file"] for e in entries} == set(files)
    assert len(entries) == len(files)
    for e in entries:
        match = HEAD.match(files[e["file"]].read_text())
        assert match, e["file"]
        spec, expect, cls, _ = match.groups()
        assert spec == e["spec"] and cls == e["class"]
        assert e["expect"] == {"rejected": "reject", "passed": "pass"}[expect]
        assert all(r in REASONS for r in e["reasons"])
        assert (FOLDER / "specs" / f"{spec}.yaml").exists()
    assert sum(e["expect"] == "reject" for e in entries) == 33
    assert sum(e["expect"] == "pass" for e in entries) == 5
