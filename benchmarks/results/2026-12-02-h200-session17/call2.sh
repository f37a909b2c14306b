#!/usr/bin/env bash
# Session 17, call 2 (~560 s of command):
#   1. scripts/gpu-suite host_overhead with HOST_OVERHEAD_BENCH=0: the wheel of the committed lock
#      (--locked) and ALL its generated tests on the GPU (session 16's batch fold for one leading dim,
#      this session's softmax and cross_entropy); then benchmarks/host_overhead.py (no --compile);
#   2. held-out level 1 on the user's path (generate = tune + verify, then the timing rows):
#      hardswish again (the tuner's 2% tie rule: call 1 chose flat1w64 by noise), then logsigmoid.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git status --short | head -8 >> "$OUT/summary.txt"
HOST_OVERHEAD_BENCH=0 timeout 330 scripts/gpu-suite host_overhead > "$OUT/logs/host_overhead_stage.log" 2>&1
log "gpu-suite host_overhead (build --locked, all generated tests): exit $?"
tail -9 "$OUT/logs/host_overhead_stage.log" | cut -c1-200 >> "$OUT/summary.txt"
grep -E "^(FAILED|ERROR)" "$OUT/host_overhead/generated_tests.log" 2>/dev/null | cut -c1-200 | head -12 >> "$OUT/summary.txt"
wheel=$(ls "$OUT"/host_overhead/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  site=$(mktemp -d /tmp/s17site.XXXX)
  python3 -m pip install -q --no-deps --no-index --target "$site" "$wheel"
  PYTHONPATH="$site:$PYTHONPATH" timeout 90 python3 benchmarks/host_overhead.py --package specgen_kernels \
    --out "$OUT/host_overhead.json" > "$OUT/logs/host_overhead.log" 2>&1
  log "host_overhead: exit $?"; grep -E "│ [a-z_]+ |target" "$OUT/logs/host_overhead.log" | cut -c1-140 >> "$OUT/summary.txt"
  rm -f "$wheel"
fi
level1() {  # level1 NAME SECONDS: a held-out problem on the user's path
  local t=$2
  LEVEL1_SETS=heldout LEVEL1_ONLY=$1 LEVEL1_BUDGET_S=$(( t - 20 )) LEVEL1_HELDOUT_S=$(( t - 20 )) \
    LEVEL1_SPEC_BUDGET_S=$(( t - 25 )) timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_$1.log" 2>&1
  log "level1 heldout $1: exit $?"
  mkdir -p "$OUT/level1_$1" && cp -r "$OUT"/level1/heldout/* "$OUT/level1_$1/" 2>/dev/null
  grep -E "^\| [a-z]" "$OUT"/level1/heldout/level1_bench.md 2>/dev/null | cut -c1-240 | head -30 >> "$OUT/summary.txt"
  rm -rf "$OUT/level1"
}
t=$(( $(left) / 2 )); [ $t -gt 150 ] && t=150
[ $t -gt 80 ] && level1 hardswish $t
t=$(( $(left) - 10 )); [ $t -gt 160 ] && t=160
[ $t -gt 80 ] && level1 logsigmoid $t
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call2.tgz"
cut -c1-260 "$OUT/summary.txt"
