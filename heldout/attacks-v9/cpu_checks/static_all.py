"""Run from the repository root: python -B heldout/attacks-v9/cpu_checks/static_all.py [file-substring ...]

Compiles every kernel of heldout/attacks-v9 with specgen's own flags (sm_90, the kernel cache in
$SPECGEN_CACHE_DIR or /tmp/specgen-v9-cache) and runs the verifier's static checks
(`specgen.verify.static_checks`: compile, symbols, stream discipline, module memory, entry points,
size functions), one kernel at a time (the machine may have two cores). Prints one line per kernel:
the verdict of the static checks (None = clean), nvcc warnings, module memory bytes, and whether
that agrees with the manifest's `static_refusal`. Needs nvcc and readelf, no GPU."""
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent
REPO = SUITE.parents[1]
sys.path.insert(0, str(REPO))

from specgen.spec import load_spec  # noqa: E402
from specgen.verify import static_checks  # noqa: E402


def main(argv: list[str]) -> int:
    manifest = json.loads((SUITE / "manifest.json").read_text())["kernels"]
    cache = Path(os.environ.get("SPECGEN_CACHE_DIR", "/tmp/specgen-v9-cache"))
    bad = 0
    for entry in manifest:
        if argv and not any(a in entry["file"] for a in argv):
            continue
        spec = load_spec(SUITE / "specs" / f"{entry['spec']}.yaml")
        verdict, compiled = static_checks(spec, SUITE / entry["file"], arch="sm_90", cache_dir=cache)
        refused = verdict is not None
        warnings = len(compiled.diagnostics) if compiled is not None else "-"
        gmem = compiled.module_memory_bytes if compiled is not None else "-"
        agrees = refused == entry["static_refusal"]
        bad += not agrees
        reason = "clean" if verdict is None else f"{verdict.reason}: {(verdict.detail or '')[:300]}"
        print(f"{entry['file']:26s} {reason:10s} warnings={warnings} gmem={gmem} "
              f"{'as manifest' if agrees else 'NOT AS MANIFEST'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
