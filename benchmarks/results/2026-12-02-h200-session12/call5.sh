#!/usr/bin/env bash
# Session 12, call 5 (the device time left, ~280 s):
#   1. the saved layernorm (mean, rstd) through the verifier again: its truth now stays float64
#      through the definition's .float() (saved.KeepFloat64);
#   2. held-out level 1, shard 3/3, as far as the time goes (scripts/gpu-suite level1).
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-270} - ($(date +%s) - started) )); }
REPO="$PWD"
compgen -G ".whl/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
timeout 110 python3 -m pytest -p no:cacheprovider -q -m gpu tests/test_saved_generator.py -k layernorm_stats \
  > "$OUT/logs/saved_layernorm.log" 2>&1
log "saved layernorm on the GPU: exit $? $(tail -1 "$OUT/logs/saved_layernorm.log")"
t=$(( $(left) - 12 ))
if [ $t -gt 90 ]; then
  LEVEL1_SETS=heldout LEVEL1_SHARD=3/3 LEVEL1_BUDGET_S=$(( t - 20 )) LEVEL1_HELDOUT_S=$(( t - 20 )) \
    timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1.log" 2>&1
  log "level1 heldout 3/3: exit $?"
  grep -E "^\| [a-z]" "$OUT"/level1/heldout/level1_bench.md 2>/dev/null | cut -c1-220 | head -40 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call5.tgz"
cat "$OUT/summary.txt" | cut -c1-250
