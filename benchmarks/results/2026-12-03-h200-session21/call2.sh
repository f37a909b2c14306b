#!/usr/bin/env bash
# Session 21, calls 2 and 3 (~540 s of command each).
#   verify (call 2 only, ~60 s, before the level-1 run so its timings have the GPU alone): held-out v2 gelu_tanh_chunked_bigpath
#     (spoiled, read after call 1) after the full-size phase gained the odd twin of its largest case.
#   heldout4: the fourth held-out problem set (heldout/problems-v4, written this session by a helper,
#     never read by the generator's developer), its first run, the user's path: tune + verify, then
#     every benchmark row beside eager and torch.compile; SHARD=1/2 in call 2, 2/2 in call 3.
set -uo pipefail
started=$(date +%s)
CALL_S=${CALL_S:-540}
left() { echo $(( CALL_S - ($(date +%s) - started) )); }
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
if [[ "${PART:-verify}" == *verify* ]]; then
  timeout 150 python3 heldout/run_attacks_v2.py heldout/attacks-v2 --only gelu_tanh_chunked_bigpath gelu_tanh_control_vec128 --no-bench --timeout 150 \
    --out "$OUT/logs/heldout-v2-bigpath.json" > "$OUT/logs/heldout-v2-bigpath.log" 2>&1
  log "v2 bigpath verify done"
fi
t=$(( $(left) - 15 ))
name=heldout4_${SHARD:-1/2}; name=${name//\//of}
LEVEL1_SETS=heldout LEVEL1_HELDOUT_DIR=heldout/problems-v4 LEVEL1_SHARD=${SHARD:-1/2} LEVEL1_BUDGET_S=$(( t - 25 )) \
  LEVEL1_HELDOUT_S=$(( t - 25 )) LEVEL1_SPEC_BUDGET_S=90 timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_$name.log" 2>&1
log "level1 heldout problems-v4 shard ${SHARD:-1/2}: exit $?"
wait
if [[ "${PART:-verify}" == *verify* ]]; then echo "== v2 bigpath" >> "$OUT/summary.txt"; grep -v "^file" "$OUT/logs/heldout-v2-bigpath.log" | cut -c1-160 >> "$OUT/summary.txt"; fi
mkdir -p "$OUT/$name" && cp -r "$OUT"/level1/heldout/* "$OUT/$name/" 2>/dev/null
grep -vE "^\[level1\] spec " "$OUT/level1/heldout.log" 2>/dev/null | tail -24 | cut -c1-200 >> "$OUT/summary.txt"
rm -rf "$OUT/level1"
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call.tgz"
cut -c1-220 "$OUT/summary.txt"
