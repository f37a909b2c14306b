#!/usr/bin/env bash
# Session 16, call 4 (~230 s of command: the device time left; the wheel and liger_ops only if LIGER=1):
#   1. cross_entropy regenerated at `few:fewtwo+medium:cl256two+split:cl256` (call 3: the medium
#      rows' two exact rounds 0.82-0.90x the forward's time), and softmax again at call 3's variant
#      (the generator now keeps the default's pair form in narrow and split rows under `twopass`:
#      call 3's kernel took the online sweep there), each verified, timed and locked;
#   2. the wheel of the lock and liger_ops.py softmax, cross_entropy (device time beside Liger).
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-430} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git rev-parse HEAD >> "$OUT/summary.txt"; git status --short | head -5 >> "$OUT/summary.txt"
CE="few:fewtwo+medium:cl256two+split:cl256"
SM="few:fewtwo+medium:cl256two+split:default+wide:cl256"
t=$(( $(left) - 5 )); [ $t -gt 250 ] && t=250
timeout $t python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops softmax,cross_entropy --variants "softmax=$SM;cross_entropy=$CE" > "$OUT/logs/builtin.log" 2>&1
log "builtin cross_entropy at $CE, softmax at $SM (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED|Error|refus" "$OUT/logs/builtin.log" | cut -c1-200 | head -6 >> "$OUT/summary.txt"
grep -E "^\| (cross_entropy|softmax) " "$OUT/builtin/builtin_bench.md" 2>/dev/null | cut -c1-200 >> "$OUT/summary.txt"
git status --short specs >> "$OUT/summary.txt"
tar czf "$OUT/specs_after.tgz" specs/kernels/cross_entropy.cu specs/kernels/softmax.cu specs/specgen.lock
work=$(mktemp -d /tmp/s16c.XXXX)
t=$(( $(left) - 30 )); [ $t -gt 90 ] && t=90
[ "${LIGER:-0}" = 1 ] && [ $t -gt 40 ] && timeout $t python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  t=$(( $(left) - 5 ))
  [ $t -gt 60 ] && PYTHONPATH="$work/site:$PYTHONPATH" timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels \
    --ops softmax,cross_entropy --dtypes bfloat16,float32 --out "$OUT/liger_ops.json" > "$OUT/logs/liger_ops.log" 2>&1
  log "liger_ops softmax, cross_entropy: exit $?"; grep -E "^\| [a-z_]+ \|" "$OUT/logs/liger_ops.log" | cut -c1-200 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt --exclude specs_after.tgz . && find "$OUT" -mindepth 1 ! -name summary.txt ! -name specs_after.tgz -delete && mv /tmp/call.tgz "$OUT/call4.tgz"
cut -c1-260 "$OUT/summary.txt"
