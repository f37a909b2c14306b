#!/usr/bin/env bash
# Session 14, call 4 (the device time left, ~220 s of command).
#   1. softmax regenerated at medium:cl256+split:default+wide:cl256+few:fewtwo (call 3's attempt hung
#      the verifier at B=64 D=7168 float32: a 1024-thread few-row block launched as 256-thread split
#      blocks; fixed: a few-row block is launched whole);
#   2. `specgen build specs/ --locked`, the generated tests of softmax, log_softmax, rmsnorm, add_rmsnorm.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-220} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

t=$(( $(left) - 70 ))
timeout $t python3 benchmarks/builtin_bench.py --out "$OUT/builtin/softmax" --dtypes bfloat16,float32 --write-lock \
  --ops softmax --variants "softmax=medium:cl256+split:default+wide:cl256+few:fewtwo" > "$OUT/logs/builtin_softmax.log" 2>&1
log "builtin softmax (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED|Error" "$OUT/logs/builtin_softmax.log" | cut -c1-250 | head -4 >> "$OUT/summary.txt"
python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['ops']['softmax']; print('softmax', d.get('variant'), [n[:160] for n in d.get('notes', [])])" \
  "$OUT/builtin/softmax/builtin_bench.json" >> "$OUT/summary.txt" 2>&1
grep -E "^\| softmax " "$OUT/builtin/softmax/builtin_bench.md" 2>/dev/null | cut -c1-200 | head -24 >> "$OUT/summary.txt"
mkdir -p "$OUT/specs_after" && cp -r specs/kernels specs/specgen.lock "$OUT/specs_after/" 2>/dev/null

work=$(mktemp -d /tmp/s14d.XXXX)
t=$(( $(left) - 25 ))
[ $t -gt 30 ] && timeout $t python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"; tail -2 "$OUT/logs/build.log" | cut -c1-200 >> "$OUT/summary.txt"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  t=$(( $(left) - 5 ))
  (cd "$work" && PYTHONPATH="$work/site:$PYTHONPATH" timeout $t python3 -m pytest -q -p no:cacheprovider -rs -x \
     -k "softmax or rmsnorm" --pyargs specgen_kernels.tests > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated tests (softmax, log_softmax, rmsnorm, add_rmsnorm): $(tail -1 "$OUT/logs/generated_tests.log")"
  grep -E "FAILED" "$OUT/logs/generated_tests.log" | head -6 | cut -c1-200 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call4.tgz"
cut -c1-250 "$OUT/summary.txt"
