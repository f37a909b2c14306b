#!/usr/bin/env bash
# Session 19, call 1 (~570 s of command): what session 18 wrote after its last call.
#   1. level1 dev: amax_rows_indices, argmin_last, max_with_indices (the `axisrows` variant, a warp
#      per row; torch.max's values from the argmax's running value);
#   2. the verifier after the value-class screen per dtype/input, the reference-value rule and the
#      per-case CPU check: the project's adversarial kernels (with bench) and the held-out attack
#      suites v2, v3, v4 (verify only);
#   3. held-out v2 nll_loss (spoiled: its physics-floor bug was fixed on the CPU) and bce_probs.
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
git log --oneline -1 >> "$OUT/summary.txt"; git status --short | head -12 >> "$OUT/summary.txt"
level1() {  # level1 SET ONLY SECONDS [folder]
  local set=$1 only=$2 t=$3 dir=${4:-heldout/problems}
  LEVEL1_SETS=$set LEVEL1_ONLY=$only LEVEL1_HELDOUT_DIR=$dir LEVEL1_BUDGET_S=$(( t - 25 )) LEVEL1_HELDOUT_S=$(( t - 25 )) \
    LEVEL1_SPEC_BUDGET_S=100 timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_${set}_${only//,/_}.log" 2>&1
  log "level1 $set $only: exit $?"
  mkdir -p "$OUT/level1_${set}_${only//,/_}" && cp -r "$OUT"/level1/$set/* "$OUT/level1_${set}_${only//,/_}/" 2>/dev/null
  if [ "$set" = dev ]; then grep -E "^\| [a-z]" "$OUT"/level1/dev/level1_bench.md 2>/dev/null | cut -c1-240 | head -30 >> "$OUT/summary.txt"
  else grep -vE "^\[level1\] spec " "$OUT/level1/heldout.log" 2>/dev/null | tail -24 | cut -c1-200 >> "$OUT/summary.txt"; fi
  rm -rf "$OUT/level1"
}
level1 dev amax_rows_indices,argmin_last,max_with_indices ${DEV_S:-230}
VERIFY_PARTS="adversarial heldout" VERIFY_HELDOUT="v2 v3 v4" VERIFY_HELDOUT_ARGS=--no-bench VERIFY_SUITE_S=${VERIFY_S:-170} \
  timeout $(( ${VERIFY_S:-170} + 30 )) scripts/gpu-suite verify > "$OUT/logs/verify.log" 2>&1
log "verify: exit $?"
sed -n '/== stage verify/,$p' "$OUT/logs/verify.log" | grep -E "summary|rejected|passed|NO |==|exit|ok" | cut -c1-200 | tail -40 >> "$OUT/summary.txt"
t=$(( $(left) - 10 ))
[ $t -gt 90 ] && level1 heldout ${V2_ONLY:-nll_loss,bce_probs} $t heldout/problems-v2
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cut -c1-260 "$OUT/summary.txt"
