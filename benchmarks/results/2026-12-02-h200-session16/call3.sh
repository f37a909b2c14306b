#!/usr/bin/env bash
# Session 16, call 3 (~540 s of command):
#   1. log_softmax and cross_entropy at 16384 x 4096 and 4096 x 8192: the committed kernels against
#      their medium rows with the exact two rounds (reg_pair twopass), profiler device time;
#   2. softmax regenerated at `few:fewtwo+medium:cl256two+split:default+wide:cl256` (call 2: the two
#      rounds 0.92x at 16384 x 4096 bf16), verified, timed and locked;
#   3. the wheel (the batch fold skipped for one leading dim), host_overhead.py, batch_overhead.py,
#      model_patch.py --rounds 3 --profile-decode, liger_ops.py softmax.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-540} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git rev-parse HEAD >> "$OUT/summary.txt"; git status --short | head -5 >> "$OUT/summary.txt"
for shape in "16384 4096" "4096 8192"; do
  set -- $shape
  timeout 80 python3 benchmarks/decode_ab.py --out "$OUT/two_$1x$2" --ops log_softmax,cross_entropy --rows "$1" --hidden "$2" \
    --sources "committed,recorded~reg_pair=twopass" --dtypes bfloat16,float32 > "$OUT/logs/two_$1x$2.log" 2>&1
  log "log_softmax, cross_entropy twopass $1x$2: exit $?"
  grep -E "^(log_softmax|cross_entropy)" "$OUT/logs/two_$1x$2.log" | cut -c1-250 >> "$OUT/summary.txt"
done
SM="few:fewtwo+medium:cl256two+split:default+wide:cl256"
timeout 220 python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops softmax --variants "softmax=$SM" > "$OUT/logs/builtin.log" 2>&1
log "builtin softmax at $SM (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED|Error|refus" "$OUT/logs/builtin.log" | cut -c1-200 | head -6 >> "$OUT/summary.txt"
grep -E "^\| softmax " "$OUT/builtin/builtin_bench.md" 2>/dev/null | cut -c1-200 >> "$OUT/summary.txt"
git status --short specs >> "$OUT/summary.txt"
tar czf "$OUT/specs_after.tgz" specs/kernels/softmax.cu specs/specgen.lock
work=$(mktemp -d /tmp/s16c.XXXX)
timeout 120 python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  export PYTHONPATH="$work/site:$PYTHONPATH"
  timeout 60 python3 benchmarks/host_overhead.py --package specgen_kernels --out "$OUT/host_overhead.json" > "$OUT/logs/host_overhead.log" 2>&1
  log "host_overhead: exit $?"; grep -E "│ [a-z_]+ |target" "$OUT/logs/host_overhead.log" | cut -c1-140 >> "$OUT/summary.txt"
  timeout 50 python3 benchmarks/batch_overhead.py --package specgen_kernels --op rmsnorm --out "$OUT/batch" > "$OUT/logs/batch_overhead.log" 2>&1
  log "batch_overhead rmsnorm: exit $?"; tail -8 "$OUT/logs/batch_overhead.log" | cut -c1-200 >> "$OUT/summary.txt"
  t=$(( $(left) - 45 )); [ $t -gt 200 ] && t=200
  [ $t -gt 60 ] && timeout $t python3 benchmarks/model_patch.py --package specgen_kernels --out "$OUT/model_patch.json" \
    --iters 10 --rounds 3 --profile-decode "$OUT/decode_profile.txt" > "$OUT/logs/model_patch.log" 2>&1
  log "model_patch: exit $?"; tail -14 "$OUT/logs/model_patch.log" | cut -c1-200 >> "$OUT/summary.txt"
  t=$(( $(left) - 5 )); [ $t -gt 60 ] && t=60
  [ $t -gt 20 ] && timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels \
    --ops softmax --shapes 8x4096,16384x4096,4096x8192 --dtypes bfloat16,float32 --out "$OUT/liger_softmax.json" > "$OUT/logs/liger_softmax.log" 2>&1
  log "liger_ops softmax: exit $?"; grep -E "^\| softmax " "$OUT/logs/liger_softmax.log" | cut -c1-200 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt --exclude specs_after.tgz . && find "$OUT" -mindepth 1 ! -name summary.txt ! -name specs_after.tgz -delete && mv /tmp/call.tgz "$OUT/call3.tgz"
cut -c1-260 "$OUT/summary.txt"
