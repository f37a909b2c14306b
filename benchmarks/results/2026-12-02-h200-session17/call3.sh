#!/usr/bin/env bash
# Session 17, call 3 (~330 s of command):
#   1. decode_ab.py cross_entropy: the committed kernel (call 1: the loss finalized in the cluster)
#      against the generator now (the gathered target logit loaded before the row's reductions), device
#      time at 1, 8 and 32 rows of 4096 and at 16384 x 4096;
#   2. cross_entropy regenerated at few:fewtwo+medium:cl256two+split:cl256, verified, timed, locked;
#   3. the wheel (--locked), its generated cross_entropy tests, liger_ops.py cross_entropy.
set -uo pipefail
started=$(date +%s)
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git status --short | head -8 >> "$OUT/summary.txt"
for shape in "1,8,32 4096" "16384 4096"; do
  set -- $shape
  timeout 70 python3 benchmarks/decode_ab.py --out "$OUT/gather_$1" --ops cross_entropy --rows "$1" --hidden "$2" \
    --sources "committed,recorded" --dtypes bfloat16,float32 > "$OUT/logs/gather_$1.log" 2>&1
  log "decode_ab cross_entropy committed vs early gather, rows $1: exit $?"
  grep -E "^cross_entropy +forward" "$OUT/logs/gather_$1.log" | sed -e 's/  */ /g' | cut -c1-220 >> "$OUT/summary.txt"
done
CE="few:fewtwo+medium:cl256two+split:cl256"
timeout 150 python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops cross_entropy --variants "cross_entropy=$CE" > "$OUT/logs/builtin.log" 2>&1
log "builtin cross_entropy (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED|Error|refus" "$OUT/logs/builtin.log" | cut -c1-200 | head -6 >> "$OUT/summary.txt"
grep -E "^\| cross_entropy " "$OUT/builtin/builtin_bench.md" 2>/dev/null | cut -c1-200 >> "$OUT/summary.txt"
git status --short specs >> "$OUT/summary.txt"
tar czf "$OUT/specs_after.tgz" specs/kernels/cross_entropy.cu specs/specgen.lock
work=$(mktemp -d /tmp/s17c.XXXX)
timeout 100 python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  (cd "$work" && PYTHONPATH="$work/site:$PYTHONPATH" timeout 80 python3 -m pytest -q -p no:cacheprovider -rs \
    --pyargs specgen_kernels.tests -k "cross_entropy" > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated tests (cross_entropy): exit $? $(tail -1 "$OUT/logs/generated_tests.log")"
  PYTHONPATH="$work/site:$PYTHONPATH" timeout 70 python3 benchmarks/liger_ops.py --package specgen_kernels \
    --ops cross_entropy --shapes 8x4096,16384x4096,4096x8192 --dtypes bfloat16,float32 --out "$OUT/liger_ce.json" > "$OUT/logs/liger_ce.log" 2>&1
  log "liger_ops cross_entropy: exit $?"; grep -E "^\| cross" "$OUT/logs/liger_ce.log" | cut -c1-200 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt --exclude specs_after.tgz . && find "$OUT" -mindepth 1 ! -name summary.txt ! -name specs_after.tgz -delete && mv /tmp/call.tgz "$OUT/call3.tgz"
cut -c1-260 "$OUT/summary.txt"
