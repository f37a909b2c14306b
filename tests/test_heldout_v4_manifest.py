"""CPU checks of heldout/attacks-v4: the manifest and the files agree (only each file's first
line is read: the suite stays held out)."""
import json
import re
from pathlib import Path

from specgen.verify.verdict import REASONS

FOLDER = Path(__file__).resolve().parents[1] / "heldout" / "attacks-v4"
FIRST = re.compile(r"\A// (\S+\.cu): attacks-v4 \(([a-z0-9-]+)\), spec ([a-z_]+)")


def test_manifest_matches_files():
    entries = json.loads((FOLDER / "manifest.json").read_text())["kernels"]
    files = {p.name: p for p in FOLDER.glob("*.cu")}
    assert {e["file"] for e in entries} == set(files) and len(entries) == len(files)
    for e in entries:
        with files[e["file"]].open() as handle:
            match = FIRST.match(handle.readline())
        assert match, e["file"]
        name, cls, spec = match.groups()
        assert name == e["file"] and spec == e["spec"]
        assert cls == ("control" if e["expect"] == "pass" else e["class"])
        assert all(r in REASONS for r in e["reasons"])
        assert (FOLDER / "specs" / f"{spec}.yaml").exists()
    assert sum(e["expect"] == "reject" for e in entries) == 30
    assert sum(e["expect"] == "pass" for e in entries) == 5
