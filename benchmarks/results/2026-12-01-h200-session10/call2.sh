#!/usr/bin/env bash
# Session 10, call 2 (run from the repository root on the GPU machine, $OUT set by the device tool):
#   1. the spread of few rows (schedule.spread_tpr): the committed kernels against the generator's
#      source now at each lock's recorded variant, timed side by side (variant_ab, no lock written);
#   2. level 1: the row norms rejected on grad_x, now with their counterexamples in the message;
#   3. the held-out level-1 problems, first third (LEVEL1_SHARD=1/3).
# Everything under $OUT goes back as one tarball plus summary.txt.
set -uo pipefail
mkdir -p "$OUT/ab"
for f in .whl; do compgen -G "$f/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $f/*.whl; done
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
timeout 200 python3 benchmarks/variant_ab.py --out "$OUT/ab" --ops softmax,log_softmax,cross_entropy,layernorm_gelu,rmsnorm,add_rmsnorm,rope \
  --a committed --b recorded --extra-shapes > "$OUT/ab/ab.log" 2>&1
echo "ab exit $?" >> "$OUT/ab/ab.log"
LEVEL1_SETS=dev LEVEL1_ONLY=l2_normalize_rows,l1_normalize_rows LEVEL1_BUDGET_S=100 \
  timeout 160 scripts/gpu-suite level1 > "$OUT/level1-dev.log" 2>&1
mv "$OUT/level1" "$OUT/level1-dev"
LEVEL1_SETS=heldout LEVEL1_SHARD=1/3 LEVEL1_BUDGET_S="${HELDOUT_BUDGET_S:-200}" \
  timeout 260 scripts/gpu-suite level1 > "$OUT/level1-heldout.log" 2>&1
{
  echo "== A/B committed vs recorded (spread)"; grep -E "geometric mean|exit" "$OUT/ab/ab.log"
  grep -E "^\| (softmax|log_softmax|cross_entropy|layernorm_gelu|rmsnorm|add_rmsnorm|rope) " "$OUT/ab/variant_ab.md" | awk -F'|' '$6+0 < 20' | head -60
  echo "== level1 dev row norms"; grep -E "^\| (l1|l2)_normalize_rows \|" "$OUT/level1-dev/dev/level1_bench.md" | cut -c1-900
  echo "== level1 held-out 1/3"; grep -v "^\[level1\] spec " "$OUT/level1/heldout.log" | tail -30
} > /tmp/summary.txt 2>&1
cd "$OUT" && tar czf /tmp/call.tgz . && find "$OUT" -mindepth 1 -delete && mv /tmp/call.tgz "$OUT/call2.tgz" && cp /tmp/summary.txt "$OUT/"
cat /tmp/summary.txt | cut -c1-400
