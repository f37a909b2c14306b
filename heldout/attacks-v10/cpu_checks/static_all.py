"""Compile every kernel of the suite with specgen's flags (sm_90, the toolkit on PATH: nvcc 13.0 when
written) and run the verifier's static checks on it (`specgen.verify.static_checks`: compile, symbols,
load-time code, stream discipline, module memory, entry points, size functions), one compile at a
time, against the suite's own specs/. Every file must compile without diagnostics and pass, as
manifest.json says (static_refusal false for all). Also checks that the manifest and the files agree
and that each file's header names its spec and expectation as the manifest does.

Spoiler: the output names nothing but files; the code of this script reads only headers' first lines.

    PYTHONPATH=. python3 -B heldout/attacks-v10/cpu_checks/static_all.py
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

SUITE = Path(__file__).resolve().parents[1]
REPO = SUITE.parents[1]
sys.path.insert(0, str(REPO))

from specgen.spec import load_spec  # noqa: E402
from specgen.verify import static_checks  # noqa: E402


def header(path: Path) -> dict:
    found = {}
    for line in path.read_text().splitlines()[:6]:
        match = re.match(r"^// (spec|expect|class): (\S+)", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def main() -> int:
    manifest = json.loads((SUITE / "manifest.json").read_text())
    entries = {e["file"]: e for e in manifest["kernels"]}
    files = sorted(p.name for p in SUITE.glob("*.cu"))
    problems = []
    if sorted(entries) != files:
        problems.append(f"manifest and files differ: {sorted(set(entries) ^ set(files))}")
    with tempfile.TemporaryDirectory(prefix="attacks-v10-static-") as cache:
        for name in files:
            path = SUITE / name
            entry = entries.get(name, {})
            head = header(path)
            spec_name = head.get("spec")
            if spec_name != entry.get("spec") or spec_name != name.rsplit("_", 1)[0]:
                problems.append(f"{name}: header spec {spec_name!r}, manifest {entry.get('spec')!r}")
            want = {"reject": "rejected", "pass": "passed"}.get(entry.get("expect"))
            if head.get("expect") != want:
                problems.append(f"{name}: header expect {head.get('expect')!r}, manifest {entry.get('expect')!r}")
            if head.get("class") != entry.get("class"):
                problems.append(f"{name}: header class {head.get('class')!r}, manifest {entry.get('class')!r}")
            spec = load_spec(SUITE / "specs" / f"{spec_name}.yaml")
            verdict, compiled = static_checks(spec, path, arch="sm_90", cache_dir=Path(cache))
            refused = verdict is not None
            diagnostics = list(compiled.diagnostics) if compiled is not None else []
            gmem = compiled.module_memory_bytes if compiled is not None else None
            status = "REFUSED " + verdict.reason if refused else "ok"
            print(f"{name:22s} {status:10s} diagnostics {len(diagnostics)}  module memory {gmem} bytes", flush=True)
            if refused != bool(entry.get("static_refusal")):
                problems.append(f"{name}: static refusal {refused}, manifest says {entry.get('static_refusal')}"
                                + (f" ({verdict.reason}: {verdict.detail[:400]})" if refused else ""))
            if diagnostics:
                problems.append(f"{name}: {len(diagnostics)} diagnostic(s): {diagnostics[:3]}")
    print()
    if problems:
        print("PROBLEMS:")
        for p in problems:
            print("  " + p)
        return 1
    print(f"all {len(files)} files compile without diagnostics and pass the static checks "
          f"({sum(e['expect'] == 'reject' for e in entries.values())} cheats, "
          f"{sum(e['expect'] == 'pass' for e in entries.values())} controls, "
          f"{len({e['spec'] for e in entries.values()})} specs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
