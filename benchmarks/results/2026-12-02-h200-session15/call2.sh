#!/usr/bin/env bash
# Session 15, call 2 (~585 s of command).
#   1. gelu_tanh and swiglu regenerated at their recorded variant (default): their specs take `*N` now;
#      the lock's spec hash is unchanged, but the kernel's first comment prints the signature, and the
#      golden test rebuilds every kernel byte for byte;
#   2. `specgen build specs/ --locked --sdist`, the wheel's generated tests of the batched ops
#      (softmax, log_softmax, rmsnorm, add_rmsnorm, gelu_tanh, swiglu);
#   3. benchmarks/liger_ops.py on that wheel beside Liger-Kernel 0.8.5, eager and torch.compile:
#      rmsnorm, add_rmsnorm, swiglu, softmax, cross_entropy; bf16 and float32; [8 x 4096],
#      [16384 x 4096], [4096 x 8192].
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
git rev-parse HEAD >> "$OUT/summary.txt"
for op in gelu_tanh swiglu; do
  t=$(( $(left) - 330 )); [ $t -gt 160 ] && t=160
  [ $t -lt 60 ] && { log "$op: not reached"; continue; }
  timeout $t python3 benchmarks/builtin_bench.py --out "$OUT/builtin/$op" --dtypes bfloat16,float32 --write-lock \
    --ops $op --variants "gelu_tanh=default;swiglu=default" > "$OUT/logs/builtin_$op.log" 2>&1
  log "builtin $op (regenerate, verify, time, lock): exit $?"
  grep -E "done in|FAILED|Error" "$OUT/logs/builtin_$op.log" | cut -c1-200 | head -4 >> "$OUT/summary.txt"
  grep -E "^\| $op " "$OUT/builtin/$op/builtin_bench.md" 2>/dev/null | cut -c1-200 | head -12 >> "$OUT/summary.txt"
done
git status --short specs >> "$OUT/summary.txt"
tar czf "$OUT/specs_after.tgz" specs/kernels specs/specgen.lock

work=$(mktemp -d /tmp/s15b.XXXX)
t=$(( $(left) - 250 )); [ $t -gt 150 ] && t=150
s=$(date +%s); timeout $t python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked --sdist > "$OUT/logs/build.log" 2>&1
log "build --locked --sdist: exit $? in $(( $(date +%s) - s )) s"; tail -3 "$OUT/logs/build.log" | cut -c1-200 >> "$OUT/summary.txt"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  ls -la "$work/dist" >> "$OUT/summary.txt"
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  t=$(( $(left) - 200 )); [ $t -gt 110 ] && t=110
  (cd "$work" && PYTHONPATH="$work/site:$PYTHONPATH" timeout $t python3 -m pytest -q -p no:cacheprovider -rs \
     -k "softmax or rmsnorm or gelu_tanh or swiglu" --pyargs specgen_kernels.tests > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated tests (the six batched ops): $(tail -1 "$OUT/logs/generated_tests.log")"
  grep -E "FAILED" "$OUT/logs/generated_tests.log" | head -6 | cut -c1-200 >> "$OUT/summary.txt"
  t=$(( $(left) - 10 ))
  [ $t -gt 30 ] && PYTHONPATH="$work/site:$PYTHONPATH" timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels \
    --ops rmsnorm,add_rmsnorm,swiglu,softmax,cross_entropy --shapes 8x4096,16384x4096,4096x8192 --dtypes bfloat16,float32 \
    --out "$OUT/liger_ops.json" > "$OUT/logs/liger_ops.log" 2>&1
  log "liger_ops: exit $?"; grep -E "^\| (softmax|rmsnorm|add_rmsnorm|swiglu|cross_entropy) " "$OUT/logs/liger_ops.log" | cut -c1-200 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt --exclude specs_after.tgz . && find "$OUT" -mindepth 1 ! -name summary.txt ! -name specs_after.tgz -delete && mv /tmp/call.tgz "$OUT/call2.tgz"
cut -c1-250 "$OUT/summary.txt"
