#!/usr/bin/env bash
# Session 12, call 2 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. regenerate five kernels of record (builtin_bench.py --write-lock, at the variants their lock
#      entries record): cross_entropy, rmsnorm and add_rmsnorm first, whose specs now declare saved
#      values (the log-sum-exp, the reciprocal RMS: their hashes changed, so their lock entries must
#      be rewritten), then bias_gelu (a [W] parameter keeps the row form again) and rope;

set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-570} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

timeout $(( $(left) - 25 )) python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops cross_entropy,rmsnorm,add_rmsnorm,bias_gelu,rope \
  --variants "cross_entropy=cl256;rmsnorm=csmem" \
  > "$OUT/logs/builtin.log" 2>&1
log "builtin (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED|Error" "$OUT/logs/builtin.log" | cut -c1-200 | head -20 >> "$OUT/summary.txt"
cp -r specs "$OUT/specs"
git status --short specs | head -30 >> "$OUT/summary.txt"

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call2.tgz"
cut -c1-300 "$OUT/summary.txt"
