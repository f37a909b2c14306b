#!/usr/bin/env bash
# Session 25's calls (copied from session 24's; AB_S caps the A/B, HELDOUT_CAP_S the held-out part) (~560 s of command each). PART picks what runs, in this order:
#   tests    the GPU tests of the scan and axis families (pytest -m gpu) in TEST_SHARDS processes
#            side by side, those matching FIRST first, at most TESTS_S seconds.
#   heldout  a held-out problem set (heldout/problems-$HELDOUT, default v5; written by a helper, never read
#            by the generator's developer), the user's path: tune (timing first, then verifying the
#            fastest first) + verify, then every benchmark row beside eager and torch.compile;
#            shard SHARD (1/2 or 2/2).
#   diag     scripts/diag/fused_rows_check.py (the fused axis variant on one-element groups)
#   ab       benchmarks/variant_ab.py: AB_OPS (spec paths) at default against AB_B (kernel time only)
#   dev      the development problems named in DEV_ONLY (comma list), same harness.
set -uo pipefail
started=$(date +%s)
CALL_S=${CALL_S:-560}
left() { echo $(( CALL_S - ($(date +%s) - started) )); }
compgen -G ".whl/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
PART=${PART:-heldout}
if [[ "$PART" == *tests* ]]; then
  # the GPU tests of the scan and axis families in TEST_SHARDS pytest processes side by side (the
  # verifier's time is mostly nvcc on the CPUs); the tests named in FIRST (-k form) lead each shard
  python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider tests/test_builtin_scan.py tests/test_axis_reduce.py \
    2>/dev/null | grep "::" > /tmp/ids.all
  { grep -E "${FIRST:-logcumsumexp|fused}" /tmp/ids.all; grep -vE "${FIRST:-logcumsumexp|fused}" /tmp/ids.all; } > /tmp/ids
  n=${TEST_SHARDS:-4}
  for k in $(seq 0 $((n - 1))); do
    awk -v n=$n -v k=$k 'NR % n == k' /tmp/ids > /tmp/ids.$k
    # SIGINT: pytest stops and still prints the failures so far (session 22 lost them to a plain kill)
    timeout -s INT -k 20 ${TESTS_S:-200} python3 -m pytest -m gpu -q -p no:cacheprovider --assert=plain --tb=short \
      $(cat /tmp/ids.$k) > "$OUT/logs/gpu-tests-$k.log" 2>&1 &
  done
  wait
  for k in $(seq 0 $((n - 1))); do
    log "gpu tests shard $k/$n ($(wc -l < /tmp/ids.$k) tests): $(tail -1 "$OUT/logs/gpu-tests-$k.log")"
    grep -E "^(FAILED|ERROR|E  )" "$OUT/logs/gpu-tests-$k.log" | cut -c1-300 | head -30 >> "$OUT/summary.txt"
  done
fi
if [[ "$PART" == *diag* ]]; then  # the fused variant against the default on one-element groups
  timeout 120 python3 scripts/diag/fused_rows_check.py > "$OUT/logs/diag.log" 2>&1
  log "diag: exit $?"; grep -E "bad rows \[\(|Error" "$OUT/logs/diag.log" | cut -c1-200 | head -20 >> "$OUT/summary.txt"
fi
if [[ "$PART" == *ab* ]]; then  # variants timed side by side (kernel only, not verified): AB_OPS, AB_B
  timeout $(( ${AB_S:-$(( $(left) - 20 ))} )) python3 benchmarks/variant_ab.py --out "$OUT/ab" --ops "${AB_OPS:?}" --a default \
    --b "${AB_B:-moments,axisfused,axisfusedmom}" > "$OUT/logs/ab.log" 2>&1
  log "variant_ab: exit $?"; tail -40 "$OUT/ab/variant_ab.md" 2>/dev/null | cut -c1-200 >> "$OUT/summary.txt"
fi
run_level1() {  # name, then the LEVEL1_ variables
  local name=$1; shift
  local t=$(( $(left) - 15 ))
  # HELDOUT_CAP_S: the held-out part's share when a dev part follows in the same call
  [ "$name" != dev ] && [ -n "${HELDOUT_CAP_S:-}" ] && [ "$t" -gt "$HELDOUT_CAP_S" ] && t=$HELDOUT_CAP_S
  env "$@" LEVEL1_BUDGET_S=$(( t - 25 )) LEVEL1_HELDOUT_S=$(( t - 25 )) LEVEL1_SPEC_BUDGET_S=${SPEC_BUDGET_S:-90} \
    timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_$name.log" 2>&1
  log "level1 $name: exit $?"
  mkdir -p "$OUT/$name" && cp -r "$OUT"/level1/* "$OUT/$name/" 2>/dev/null
  for f in "$OUT"/level1/*.log; do grep -vE "^\[level1\] spec " "$f" | tail -24 | cut -c1-200 >> "$OUT/summary.txt"; done
  rm -rf "$OUT/level1"
}
if [[ "$PART" == *heldout* ]]; then
  hv=${HELDOUT:-v5}; name=heldout${hv#v}_${SHARD:-1/3}; name=${name//\//of}
  run_level1 "$name" LEVEL1_SETS=heldout LEVEL1_HELDOUT_DIR=heldout/problems-$hv LEVEL1_SHARD=${SHARD:-1/3} ${SKIP:+LEVEL1_SKIP_REACHED="$SKIP"}
fi
if [[ "$PART" == *dev* ]]; then
  run_level1 dev LEVEL1_SETS=dev LEVEL1_ONLY="${DEV_ONLY:?DEV_ONLY names the problems}" ${DEV_ARGS:+LEVEL1_ARGS="$DEV_ARGS"}
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call.tgz"
cut -c1-220 "$OUT/summary.txt"
