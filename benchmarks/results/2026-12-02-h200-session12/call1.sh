#!/usr/bin/env bash
# Session 12, call 1 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. regenerate four kernels of record with no saved values to gain (bias_gelu, softmax,
#      log_softmax, rope) at the variants their lock entries record (builtin_bench.py --write-lock:
#      verified here, timed beside eager and torch.compile, bf16 and float32); specs/ comes back;
#   2. saved intermediates on the GPU: the generated kernels through the verifier, then the wheel
#      with saved values running its own tests (CPU-tested only until now).
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-585} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

timeout 330 python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops bias_gelu,softmax,log_softmax,rope \
  --variants "softmax=medium:cl256+split:default+wide:cl256" \
  > "$OUT/logs/builtin.log" 2>&1
log "builtin (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED" "$OUT/logs/builtin.log" | cut -c1-200 >> "$OUT/summary.txt"
cp -r specs "$OUT/specs"
git status --short specs | head -30 >> "$OUT/summary.txt"

t=$(( $(left) - 10 ))
timeout $t python3 -m pytest -p no:cacheprovider -q -m gpu tests/test_saved_generator.py tests/test_saved_package.py \
  > "$OUT/logs/saved_gpu.log" 2>&1
log "saved intermediates, GPU tests: exit $?"; tail -15 "$OUT/logs/saved_gpu.log" | cut -c1-250 >> "$OUT/summary.txt"

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cut -c1-300 "$OUT/summary.txt"
