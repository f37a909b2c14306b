#!/usr/bin/env bash
# Session 12, call 3 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. `specgen build specs/ --locked`: the wheel of the kernels regenerated in calls 1-2 (cross_entropy,
#      rmsnorm and add_rmsnorm now save their row statistics for the backward);
#   2. the wheel's own generated tests for those three ops (the saved values through the C++ autograd);
#   3. benchmarks/liger_ops.py on that wheel beside Liger-Kernel, eager and torch.compile: bf16 and
#      float32, decode [8 x 4096], [16384 x 4096] and [4096 x 8192].
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-540} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

work=$(mktemp -d /tmp/s12.XXXX)
timeout 260 python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"; tail -2 "$OUT/logs/build.log" | cut -c1-200 >> "$OUT/summary.txt"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  export PYTHONPATH="$work/site:$PYTHONPATH"
  (cd "$work" && timeout 70 python3 -m pytest -q -p no:cacheprovider -k "cross_entropy or rmsnorm" --pyargs specgen_kernels.tests > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated tests (cross_entropy, rmsnorm, add_rmsnorm): $(tail -1 "$OUT/logs/generated_tests.log")"
  t=$(( $(left) - 8 ))
  [ $t -gt 30 ] && timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels --dtypes bfloat16,float32 \
    --shapes 8x4096,16384x4096,4096x8192 --out "$OUT/liger_ops.json" > "$OUT/logs/liger_ops.log" 2>&1
  log "liger_ops: exit $?"; grep -E "^\S+ +forward" "$OUT/logs/liger_ops.log" | head -80 >> "$OUT/summary.txt"
fi

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call3.tgz"
cut -c1-300 "$OUT/summary.txt"
