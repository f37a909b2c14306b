#!/usr/bin/env bash
# Session 18, call 1 (~570 s of command), on the tree of the session's start (f4279cc):
#   1. flat_study.py on the development suite's softplus at its benchmark shape (6.4 GB float32):
#      every launch shape, (1, 4096) against (2, 4096) above all (NOTES after session 17, item 2);
#   2. decode_ab.py: the reduction tree (`red_form=tree`) against the recorded serial form, softmax,
#      log_softmax, rmsnorm, cross_entropy at 1, 8 and 16384 rows of 4096 (item 4);
#   3. the second held-out set (heldout/problems-v2) on the user's path, first part (item 5).
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-570} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git status --short | head -8 >> "$OUT/summary.txt"
timeout 130 python3 benchmarks/flat_study.py benchmarks/level1/specs/softplus.yaml --dtypes float32,bfloat16 \
  --out "$OUT/flat_softplus.json" > "$OUT/logs/flat_softplus.log" 2>&1
log "flat_study softplus: exit $?"
grep -vE "^\[" "$OUT/logs/flat_softplus.log" | tail -30 | cut -c1-160 >> "$OUT/summary.txt"
timeout 110 python3 benchmarks/decode_ab.py --out "$OUT/red_tree" --ops softmax,log_softmax,rmsnorm,cross_entropy \
  --rows 1,8,16384 --sources "recorded,recorded~red_form=tree" > "$OUT/logs/red_tree.log" 2>&1
log "decode_ab red_form tree vs recorded: exit $?"
grep -E "rows=" "$OUT/logs/red_tree.log" | cut -c1-160 >> "$OUT/summary.txt"
t=$(( $(left) - 15 ))
if [ $t -gt 90 ]; then
  LEVEL1_SETS=heldout LEVEL1_HELDOUT_DIR=heldout/problems-v2 LEVEL1_ONLY=${V2_ONLY:-argmax_last_3d,bce_probs,clamp_scalars,maxpool1d,prod_dim1} \
    LEVEL1_BUDGET_S=$(( t - 30 )) LEVEL1_HELDOUT_S=$(( t - 30 )) LEVEL1_SPEC_BUDGET_S=110 \
    timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_v2.log" 2>&1
  log "level1 heldout v2 part 1: exit $?"
  grep -vE "^\[level1\] spec " "$OUT/level1/heldout.log" 2>/dev/null | tail -30 | cut -c1-220 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cut -c1-260 "$OUT/summary.txt"
