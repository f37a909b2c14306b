#!/usr/bin/env bash
# Session 13, call 3 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. leading batch dims: the two batch specs' kernels written by the built-in generator (the
#      rmsnorm one is the verified rmsnorm kernel under another name), the wheel built with
#      --no-verify (no generation or verification: this call is about the package's batch
#      plumbing), its generated tests (the fixed expectations), benchmarks/batch_overhead.py;
#   2. held-out level 1, shard 3/3 from where session 12 stopped (hardswish, logsigmoid, sum_dim0),
#      through the user's path (scripts/gpu-suite level1), as far as the time goes.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

work=$(mktemp -d /tmp/s13c.XXXX)
cp -r tests/batch_specs "$work/batch_specs" && mkdir -p "$work/batch_specs/kernels"
python3 - "$work/batch_specs" <<'PY'
import sys
from pathlib import Path
from specgen.agents.builtin.generator import build_source
from specgen.spec import load_spec
folder = Path(sys.argv[1])
for path in sorted(folder.glob("*.yaml")):
    spec = load_spec(path)
    (folder / "kernels" / f"{spec.name}.cu").write_text(build_source(spec))
PY
timeout 150 python3 -m specgen build "$work/batch_specs" -o "$work/bdist" --name specgen_batch --no-verify \
  > "$OUT/logs/batch_build.log" 2>&1
log "batch build (--no-verify): exit $?"; tail -2 "$OUT/logs/batch_build.log" | cut -c1-200 >> "$OUT/summary.txt"
bwheel=$(ls "$work"/bdist/specgen_batch-*.whl 2>/dev/null | head -1)
if [ -n "$bwheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/bsite" "$bwheel"
  (cd "$work" && PYTHONPATH="$work/bsite:$PYTHONPATH" timeout 90 python3 -m pytest -q -p no:cacheprovider -rs -W ignore \
     --pyargs specgen_batch.tests > "$OUT/logs/batch_generated_tests.log" 2>&1)
  log "batch generated tests: $(tail -1 "$OUT/logs/batch_generated_tests.log")"
  grep -E "^FAILED|^E  " "$OUT/logs/batch_generated_tests.log" | head -8 | cut -c1-220 >> "$OUT/summary.txt"
  PYTHONPATH="$work/bsite:$PYTHONPATH" timeout 60 python3 -W ignore benchmarks/batch_overhead.py \
    --package specgen_batch --op rmsnorm_batched --out "$OUT" > "$OUT/logs/batch_overhead.log" 2>&1
  log "batch overhead: exit $?"; cut -c1-250 "$OUT/logs/batch_overhead.log" | tail -6 >> "$OUT/summary.txt"
fi

t=$(( $(left) - 15 ))
if [ $t -gt 90 ]; then
  LEVEL1_SETS=heldout LEVEL1_ONLY=hardswish,logsigmoid,sum_dim0 LEVEL1_BUDGET_S=$(( t - 25 )) \
    LEVEL1_HELDOUT_S=$(( t - 25 )) timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1.log" 2>&1
  log "level1 heldout (hardswish, logsigmoid, sum_dim0): exit $?"
  grep -E "^\| [a-z]" "$OUT"/level1/heldout/level1_bench.md 2>/dev/null | cut -c1-220 | head -40 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call3.tgz"
cut -c1-250 "$OUT/summary.txt"
