#!/usr/bin/env bash
# Session 14, call 2 (from the repository root on the GPU machine; ~500 s).
# softmax, log_softmax, rmsnorm, add_rmsnorm regenerated: their specs now take leading batch dims
# (`x: Tensor[*B, D]`) and a decode row of 8 (the few-rows class the tuner could not see at 64
# rows), so their hashes changed. builtin_bench.py --write-lock tunes each among its recorded
# variants and the few-row forms (fewtwo: a block per row, max round then sum round).
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-500} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

for op in softmax log_softmax rmsnorm add_rmsnorm; do
  t=$(( $(left) - 15 )); [ $t -gt 200 ] && t=200
  [ $t -lt 60 ] && { log "$op: not reached"; continue; }
  timeout $t python3 benchmarks/builtin_bench.py --out "$OUT/builtin/$op" --dtypes bfloat16,float32 --write-lock \
    --ops $op --variants "softmax=default,cl256,fewtwo;log_softmax=default,fewtwo;rmsnorm=default,csmem,fewblock;add_rmsnorm=default,fewblock" \
    > "$OUT/logs/builtin_$op.log" 2>&1
  log "builtin $op (regenerate, verify, time, lock): exit $?"
  grep -E "done in|FAILED|Error|chose|chosen" "$OUT/logs/builtin_$op.log" | cut -c1-200 | head -6 >> "$OUT/summary.txt"
  grep -E "^\| $op " "$OUT/builtin/$op/builtin_bench.md" 2>/dev/null | cut -c1-200 | head -24 >> "$OUT/summary.txt"
done
mkdir -p "$OUT/specs_after" && cp -r specs/kernels specs/specgen.lock "$OUT/specs_after/" 2>/dev/null
git status --short specs | head >> "$OUT/summary.txt"
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call2.tgz"
cut -c1-250 "$OUT/summary.txt"
