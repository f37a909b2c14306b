#!/usr/bin/env python3
"""Compile every attacks-v12 kernel with specgen's own flags and run the verifier's static checks on it
(specgen.verify.static_checks: nvcc -O3 for sm_90, the symbol check, load-time code, stream
discipline, module memory, entry points, size functions), one file at a time; build each again as
version 16 does for the other host's plain char (specgen.verify.char_abi.build_other_abi: on x86-64
-funsigned-char, as an aarch64 host builds it); and check
manifest.json against the files' headers (`// spec:`, `// expect:`, `// class:`).

    PYTHONPATH=. python3 heldout/attacks-v12/cpu_checks/static_all.py [--only NAME ...]

Exit 0 when every file compiles without a diagnostic, its static_refusal is what the manifest says
(false for all), and every header matches its manifest entry.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
REPO = SUITE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HEADER = re.compile(r"^// (spec|expect|class): (\S+)\s*$")


def header(path: Path) -> dict:
    found = {}
    for line in path.read_text().splitlines()[:3]:
        if match := HEADER.match(line):
            found[match[1]] = match[2]
    return found


def main() -> int:
    from specgen.spec import load_spec
    from specgen.verify import static_checks
    from specgen.verify.char_abi import build_other_abi

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    manifest = json.loads((SUITE / "manifest.json").read_text())
    entries = manifest["kernels"]
    problems: list[str] = []
    listed = {e["file"] for e in entries}
    present = {p.name for p in SUITE.glob("*.cu")}
    if listed != present:
        problems.append(f"manifest and folder differ: only listed {sorted(listed - present)}, "
                        f"only present {sorted(present - listed)}")
    if args.only:
        entries = [e for e in entries if any(o in e["file"] for o in args.only)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="attacks-v12-static-") as cache:
        for entry in entries:
            path = SUITE / entry["file"]
            head = header(path)
            for key in ("spec", "expect", "class"):
                if head.get(key) != entry[key]:
                    problems.append(f"{entry['file']}: header {key} {head.get(key)!r}, manifest {entry[key]!r}")
            spec = load_spec(SUITE / "specs" / f"{entry['spec']}.yaml")
            started = time.perf_counter()
            verdict, compiled = static_checks(spec, path, arch=args.arch, cache_dir=Path(cache))
            refusal = verdict is not None
            diagnostics = [str(d) for d in (compiled.diagnostics if compiled else [])]
            stack = max((r.get("stack_bytes", 0) for r in (compiled.resources.values() if compiled else [])),
                        default=0)
            row = {"file": entry["file"], "static_refusal": refusal,
                   "reason": verdict.reason if refusal else None,
                   "detail": (verdict.detail or "")[:500] if refusal else None,
                   "diagnostics": diagnostics,
                   "module_memory_bytes": compiled.module_memory_bytes if compiled else None,
                   "max_stack_bytes": stack, "kernels": len(compiled.resources) if compiled else 0,
                   "seconds": round(time.perf_counter() - started, 1)}
            other = build_other_abi(spec, path, arch=args.arch, cache_dir=Path(cache))
            row["other_char_build"] = "ok" if other.library else (other.verdict.reason if other.verdict else other.problem)
            if not other.library:
                problems.append(f"{entry['file']}: the other plain-char build failed: {row['other_char_build']}")
            rows.append(row)
            if refusal != entry["static_refusal"]:
                problems.append(f"{entry['file']}: static_refusal {refusal} ({row['reason']}: {row['detail']}), "
                                f"manifest says {entry['static_refusal']}")
            if diagnostics:
                problems.append(f"{entry['file']}: {len(diagnostics)} diagnostic(s): {diagnostics[:3]}")
            print(f"{entry['file']:<22} refusal={str(refusal):<5} diagnostics={len(diagnostics)} "
                  f"module_memory={row['module_memory_bytes']} max_stack={stack} kernels={row['kernels']} "
                  f"other_char_build={row['other_char_build']} "
                  f"({row['seconds']} s)", flush=True)
    print()
    if problems:
        print("PROBLEMS:")
        for p in problems:
            print("  " + p)
        return 1
    print(f"all {len(rows)} files: compiled without diagnostics (and as for the other plain char), static checks as the manifest says, headers "
          f"match the manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
