#!/usr/bin/env bash
# Session 11, call 2 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. benchmarks/decode_ab.py: the few-rows schedule (a row over a cluster of 8 blocks, one chunk
#      per thread, while rows x 8 blocks fit in two waves) against the same generator without it
#      (`nofew`) and the committed kernels, by the profiler's device time per call, rows 1/8/32/64
#      of 4096, bf16 and float32, every example op with a kernel;
#   2. the level-1 held-out set, shard 2/3, with the time left (the user's path: generate, tune, bench).
# One tarball and summary.txt come back.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-540} - ($(date +%s) - started) )); }
REPO="$PWD"
compgen -G ".whl/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git log --oneline -1 >> "$OUT/summary.txt" 2>/dev/null

timeout 330 python3 benchmarks/decode_ab.py --out "$OUT/decode" \
  --ops softmax,log_softmax,cross_entropy,swiglu,gelu_tanh,bias_gelu,layernorm_gelu,rmsnorm,add_rmsnorm,rope \
  --sources default,nofew,committed --rows 1,8,32,64 > "$OUT/logs/decode_ab.log" 2>&1
log "decode_ab: exit $?"
grep -E "^[a-z_]+ +(forward|backward)" "$OUT/logs/decode_ab.log" | sed 's/  */ /g' | cut -c1-200 >> "$OUT/summary.txt"
tail -3 "$OUT/logs/decode_ab.log" | cut -c1-300 >> "$OUT/summary.txt"

t=$(( $(left) - 15 ))
if [ $t -gt 120 ]; then
  LEVEL1_SETS=heldout LEVEL1_SHARD=2/3 LEVEL1_BUDGET_S=$(( t - 30 )) LEVEL1_HELDOUT_S=$(( t - 30 )) \
    timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1.log" 2>&1
  log "level1 heldout 2/3: exit $?"
  grep -E "^\| [a-z]" "$OUT"/level1/heldout/level1_bench.md 2>/dev/null | cut -c1-220 | head -40 >> "$OUT/summary.txt"
  grep -E "lowered|verified|geomean|rows" "$OUT"/level1/heldout/level1_bench.md 2>/dev/null | tail -6 >> "$OUT/summary.txt"
fi

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call2.tgz"
cut -c1-300 "$OUT/summary.txt"
