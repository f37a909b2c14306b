#!/usr/bin/env bash
# Session 14, call 3 (from the repository root on the GPU machine; the device time left, ~590 s).
#   1. softmax, log_softmax (again: the block form of few rows now takes up to 2 rows per SM, so
#      the 64-row decode row too) and add_rmsnorm regenerated at one variant each (their specs take
#      `*B` and a decode row of 8): builtin_bench.py --write-lock;
#   2. `specgen build specs/ --locked`, the generated tests of the batched ops;
#   3. liger_ops.py at decode sizes (8 and 64 rows of 4096) for rmsnorm, add_rmsnorm, softmax.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-585} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

for op in softmax log_softmax add_rmsnorm; do
  t=$(( $(left) - 200 )); [ $t -gt 190 ] && t=190
  [ $t -lt 60 ] && { log "$op: not reached"; continue; }
  timeout $t python3 benchmarks/builtin_bench.py --out "$OUT/builtin/$op" --dtypes bfloat16,float32 --write-lock \
    --ops $op --variants "softmax=medium:cl256+split:default+wide:cl256+few:fewtwo;log_softmax=fewtwo;add_rmsnorm=default" \
    > "$OUT/logs/builtin_$op.log" 2>&1
  log "builtin $op (regenerate, verify, time, lock): exit $?"
  grep -E "done in|FAILED|Error" "$OUT/logs/builtin_$op.log" | cut -c1-200 | head -4 >> "$OUT/summary.txt"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['ops'][sys.argv[2]]; print(sys.argv[2], d.get('variant'), [n[:160] for n in d.get('notes', [])])" \
    "$OUT/builtin/$op/builtin_bench.json" $op >> "$OUT/summary.txt" 2>&1
  grep -E "^\| $op " "$OUT/builtin/$op/builtin_bench.md" 2>/dev/null | cut -c1-200 | head -24 >> "$OUT/summary.txt"
done
mkdir -p "$OUT/specs_after" && cp -r specs/kernels specs/specgen.lock "$OUT/specs_after/" 2>/dev/null
git status --short specs | head >> "$OUT/summary.txt"

work=$(mktemp -d /tmp/s14c.XXXX)
t=$(( $(left) - 100 )); [ $t -gt 200 ] && t=200
timeout $t python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"; tail -2 "$OUT/logs/build.log" | cut -c1-200 >> "$OUT/summary.txt"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  t=$(( $(left) - 45 )); [ $t -gt 100 ] && t=100
  (cd "$work" && PYTHONPATH="$work/site:$PYTHONPATH" timeout $t python3 -m pytest -q -p no:cacheprovider -rs \
     -k "softmax or rmsnorm" --pyargs specgen_kernels.tests > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated tests (softmax, log_softmax, rmsnorm, add_rmsnorm): $(tail -1 "$OUT/logs/generated_tests.log")"
  grep -E "FAILED" "$OUT/logs/generated_tests.log" | head -6 | cut -c1-200 >> "$OUT/summary.txt"
  t=$(( $(left) - 8 )); [ $t -gt 90 ] && t=90
  [ $t -gt 20 ] && PYTHONPATH="$work/site:$PYTHONPATH" timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels \
    --ops softmax,rmsnorm,add_rmsnorm --shapes 8x4096,64x4096 --dtypes bfloat16,float32 --out "$OUT/liger_decode.json" \
    > "$OUT/logs/liger_decode.log" 2>&1
  log "liger_ops decode: exit $?"; grep -E "^\| (softmax|rmsnorm|add_rmsnorm)" "$OUT/logs/liger_decode.log" | cut -c1-200 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call3.tgz"
cut -c1-250 "$OUT/summary.txt"
