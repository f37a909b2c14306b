#!/usr/bin/env bash
# Session 13, call 2 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. rope regenerated with `no_grad: [cos, sin]` (its backward computes only grad_x now; the spec's
#      hash changed): builtin_bench.py --write-lock, tuning default, rows256 and wave;
#   2. `specgen build specs/ --locked` (the wheel with the new rope), its generated tests for rope
#      (the refusal of a table that requires grad, through the C++ autograd);
#   3. benchmarks/liger_ops.py --ops rope: forward and forward+backward beside Liger, eager and
#      torch.compile, bf16 and float32, decode [8 x 4096], [16384 x 4096], [4096 x 8192];
#   4. leading batch dims again (call 1 stopped at a spec without benchmark shapes, fixed):
#      `specgen build tests/batch_specs --no-tune`, its generated tests, benchmarks/batch_overhead.py.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

timeout 200 python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops rope --variants "rope=default,rows256,wave" > "$OUT/logs/builtin.log" 2>&1
log "builtin rope (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED|Error|chose|variant" "$OUT/logs/builtin.log" | cut -c1-200 | head -12 >> "$OUT/summary.txt"
grep -E "^\| rope" "$OUT/builtin/builtin_bench.md" 2>/dev/null | cut -c1-220 | head -12 >> "$OUT/summary.txt"
mkdir -p "$OUT/specs_after" && cp -r specs/kernels specs/specgen.lock* "$OUT/specs_after/" 2>/dev/null
git status --short specs | head >> "$OUT/summary.txt"

work=$(mktemp -d /tmp/s13b.XXXX)
timeout 200 python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"; tail -2 "$OUT/logs/build.log" | cut -c1-200 >> "$OUT/summary.txt"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  (cd "$work" && PYTHONPATH="$work/site:$PYTHONPATH" timeout 80 python3 -m pytest -q -p no:cacheprovider -rs -k rope \
     --pyargs specgen_kernels.tests > "$OUT/logs/generated_tests_rope.log" 2>&1)
  log "generated tests (rope): $(tail -1 "$OUT/logs/generated_tests_rope.log")"
  grep -E "FAILED|no_grad" "$OUT/logs/generated_tests_rope.log" | head -5 >> "$OUT/summary.txt"
  PYTHONPATH="$work/site:$PYTHONPATH" timeout 120 python3 benchmarks/liger_ops.py --package specgen_kernels --ops rope \
    --dtypes bfloat16,float32 --out "$OUT/liger_rope.json" > "$OUT/logs/liger_rope.log" 2>&1
  log "liger_ops rope: exit $?"; grep -E "^\| rope" "$OUT/logs/liger_rope.log" | cut -c1-200 >> "$OUT/summary.txt"
fi

cp -r tests/batch_specs "$work/batch_specs"
t=$(( $(left) - 70 )); [ $t -gt 200 ] && t=200
timeout $t python3 -m specgen build "$work/batch_specs" -o "$work/bdist" --name specgen_batch --no-tune \
  > "$OUT/logs/batch_build.log" 2>&1
log "batch build: exit $?"; tail -3 "$OUT/logs/batch_build.log" | cut -c1-200 >> "$OUT/summary.txt"
bwheel=$(ls "$work"/bdist/specgen_batch-*.whl 2>/dev/null | head -1)
if [ -n "$bwheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/bsite" "$bwheel"
  t=$(( $(left) - 40 )); [ $t -gt 90 ] && t=90
  (cd "$work" && PYTHONPATH="$work/bsite:$PYTHONPATH" timeout $t python3 -m pytest -q -p no:cacheprovider -rs \
     --pyargs specgen_batch.tests > "$OUT/logs/batch_generated_tests.log" 2>&1)
  log "batch generated tests: $(tail -1 "$OUT/logs/batch_generated_tests.log")"
  grep -E "FAILED" "$OUT/logs/batch_generated_tests.log" | head -5 | cut -c1-200 >> "$OUT/summary.txt"
  t=$(( $(left) - 8 )); [ $t -gt 60 ] && t=60
  [ $t -gt 15 ] && PYTHONPATH="$work/bsite:$PYTHONPATH" timeout $t python3 benchmarks/batch_overhead.py \
    --package specgen_batch --op rmsnorm_batched --out "$OUT" > "$OUT/logs/batch_overhead.log" 2>&1
  log "batch overhead: exit $?"; cut -c1-250 "$OUT/logs/batch_overhead.log" >> "$OUT/summary.txt"
fi

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call2.tgz"
cut -c1-250 "$OUT/summary.txt"
