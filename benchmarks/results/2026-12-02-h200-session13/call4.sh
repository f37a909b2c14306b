#!/usr/bin/env bash
# Session 13, call 4 (the device time left, ~390 s; from the repository root on the GPU machine).
#   1. benchmarks/precision_ab.py: the default against the `chains` variant (a streamed row's float
#      sums in one partial per chunk in flight) on float32 norms at `huge` inputs, 24 seeds, with
#      times at a wide looped shape and at the benchmark shape; layernorm_hw_affine's two sources
#      through the verifier;
#   2. held-out level 1 `layernorm_2d_affine` (refused for precision in session 11) through the
#      user's path again (the tuner now has `chains` to try), as far as the time goes.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-360} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

timeout 150 python3 benchmarks/precision_ab.py --out "$OUT" --sources default,chains > "$OUT/logs/precision_ab.log" 2>&1
log "precision_ab: exit $?"; grep -v "^\[\|Warning\|warn" "$OUT/logs/precision_ab.log" | tail -12 | cut -c1-250 >> "$OUT/summary.txt"

t=$(( $(left) - 12 ))
if [ $t -gt 90 ]; then
  LEVEL1_SETS=heldout LEVEL1_ONLY=layernorm_2d_affine LEVEL1_BUDGET_S=$(( t - 20 )) LEVEL1_HELDOUT_S=$(( t - 20 )) \
    LEVEL1_SPEC_BUDGET_S=$(( t - 25 )) timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1.log" 2>&1
  log "level1 heldout layernorm_2d_affine: exit $?"
  grep -E "^\| [a-z]" "$OUT"/level1/heldout/level1_bench.md 2>/dev/null | cut -c1-220 | head -30 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call4.tgz"
cut -c1-250 "$OUT/summary.txt"
