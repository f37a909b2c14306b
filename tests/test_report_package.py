"""The generated package's README carries the performance summary (and says when a reference
is imported rather than copied)."""
from __future__ import annotations

from conftest import REPO, SPECS
from specgen.lock import Lock
from specgen.package import package_model, render_files
from specgen.package.provenance import best_record, op_provenance
from specgen.report.data import geomean
from specgen.spec import load_spec


def test_the_package_readme_embeds_the_summary_of_the_lock():
    spec = load_spec(SPECS / "softmax.yaml")
    entry = Lock.load(SPECS).entry("softmax")
    provenance = {"softmax": op_provenance(entry, symbols=spec.signature.symbols())}
    readme = render_files(package_model("sgsum", [spec], {"softmax": "// kernel"}, provenance=provenance))["README.md"]
    assert "## Performance summary" in readme and "specgen report" in readme
    record = best_record(entry)  # the record the package's provenance shows
    rows = [r for r in record.benchmark["rows"] if r["direction"] == "forward"]
    line = next(line for line in readme.splitlines() if line.startswith("| `softmax` | forward |"))
    assert f"{geomean(r['speedup_vs_compile'] for r in rows):.2f}x" in line
    cases = record.verification.get("cases", record.verification.get("examples"))
    assert f"{cases} cases" in readme  # the lock's record says "examples"; the README names them


def test_an_imported_reference_is_named_not_copied():
    spec = load_spec(REPO / "examples" / "import" / "rmsnorm_model.yaml")
    files = render_files(package_model("sgimp", [spec], {}))
    assert "imported from `rmsnorm_model` (not copied" in files["README.md"]
    assert "class Model" not in files["torch-ext/sgimp/_reference_rmsnorm_model.py"]
