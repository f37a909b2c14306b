#!/usr/bin/env bash
# Session 18, call 2 (~580 s of command):
#   1. the development suite's arg-reductions on the user's path (generate = tune + verify, then the
#      timing rows beside eager and torch.compile): amax_rows_indices (new: many rows of 4096, a
#      block each) and argmin_last. The axis kernels' partials now merge by warp shuffles before the
#      shared-memory tree (`axis_merge` "warp", the new default); the tuner also tries `axistree`
#      (the old tree over all 256 threads) and keeps the default unless the tree is > 2% faster;
#   2. flat_study.py on softplus at 6.4 GB, plain timing only (call 1's harness row ran out of
#      memory beside the plain tensors): launch shape (2, 4096) against (1, 4096);
#   3. held-out v2: bce_probs again (call 1: every variant "crashed" on a device-side assert of the
#      reference's value check; now the verifier leaves out the value class the reference refuses),
#      then new_gelu.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-580} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git status --short | head -12 >> "$OUT/summary.txt"
level1() {  # level1 SET ONLY SECONDS [folder]
  local set=$1 only=$2 t=$3 dir=${4:-heldout/problems}
  LEVEL1_SETS=$set LEVEL1_ONLY=$only LEVEL1_HELDOUT_DIR=$dir LEVEL1_BUDGET_S=$(( t - 25 )) LEVEL1_HELDOUT_S=$(( t - 25 )) \
    LEVEL1_SPEC_BUDGET_S=100 timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_${set}_${only//,/_}.log" 2>&1
  log "level1 $set $only: exit $?"
  mkdir -p "$OUT/level1_${set}_${only//,/_}" && cp -r "$OUT"/level1/$set/* "$OUT/level1_${set}_${only//,/_}/" 2>/dev/null
  if [ "$set" = dev ]; then grep -E "^\| [a-z]" "$OUT"/level1/dev/level1_bench.md 2>/dev/null | cut -c1-240 | head -24 >> "$OUT/summary.txt"
  else grep -vE "^\[level1\] spec " "$OUT/level1/heldout.log" 2>/dev/null | tail -24 | cut -c1-200 >> "$OUT/summary.txt"; fi
  rm -rf "$OUT/level1"
}
level1 dev amax_rows_indices,argmin_last 250
timeout 100 python3 benchmarks/flat_study.py benchmarks/level1/specs/softplus.yaml --dtypes float32,bfloat16 --harness "" \
  --out "$OUT/flat_softplus.json" > "$OUT/logs/flat_softplus.log" 2>&1
log "flat_study softplus: exit $?"
grep -vE "^\[" "$OUT/logs/flat_softplus.log" | tail -20 | cut -c1-160 >> "$OUT/summary.txt"
t=$(( $(left) - 10 ))
[ $t -gt 90 ] && level1 heldout bce_probs,new_gelu $t heldout/problems-v2
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call2.tgz"
cut -c1-260 "$OUT/summary.txt"
