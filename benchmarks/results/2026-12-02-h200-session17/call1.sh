#!/usr/bin/env bash
# Session 17, call 1 (~560 s of command):
#   1. softmax and cross_entropy regenerated with twopass's narrow/split rows on the default's pair
#      form (session 16's twopass-local.diff, now in emit.py) and (cross_entropy) the few rows'
#      loss finalized in their own cluster (few_fin): softmax at
#      few:fewtwo+medium:cl256two+split:default+wide:cl256, cross_entropy at
#      few:fewtwo+medium:cl256two+split:cl256; verified, timed, locked;
#   2. tests/test_builtin_few_finalize.py on the GPU (the cluster finalize's bits = the finalize kernel's);
#      decode_ab.py cross_entropy: the new kernel against the same with few_fin=launch (device time);
#   3. the wheel of that lock (--locked) and its generated tests for the two ops;
#   4. liger_ops.py softmax, cross_entropy beside Liger 0.8.5, torch.compile and eager;
#   5. held-out level 1 hardswish with the uncapped flat grid (the user's path), if time is left.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git status --short | head -8 >> "$OUT/summary.txt"
SM="few:fewtwo+medium:cl256two+split:default+wide:cl256"
CE="few:fewtwo+medium:cl256two+split:cl256"
timeout 280 python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops softmax,cross_entropy --variants "softmax=$SM;cross_entropy=$CE" > "$OUT/logs/builtin.log" 2>&1
log "builtin softmax, cross_entropy (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED|Error|refus" "$OUT/logs/builtin.log" | cut -c1-200 | head -6 >> "$OUT/summary.txt"
python3 -c "
import json,sys
for op, d in json.load(open(sys.argv[1]))['ops'].items(): print(op, d.get('variant'), [n[:160] for n in d.get('notes', [])])" \
  "$OUT/builtin/builtin_bench.json" >> "$OUT/summary.txt" 2>&1
grep -E "^\| (softmax|cross_entropy) " "$OUT/builtin/builtin_bench.md" 2>/dev/null | cut -c1-200 >> "$OUT/summary.txt"
git status --short specs >> "$OUT/summary.txt"
tar czf "$OUT/specs_after.tgz" specs/kernels/softmax.cu specs/kernels/cross_entropy.cu specs/specgen.lock
timeout 90 python3 -m pytest -q -p no:cacheprovider -rs tests/test_builtin_few_finalize.py > "$OUT/logs/few_finalize_test.log" 2>&1
log "tests/test_builtin_few_finalize.py: exit $? $(tail -1 "$OUT/logs/few_finalize_test.log")"
timeout 80 python3 benchmarks/decode_ab.py --out "$OUT/ce_fin" --ops cross_entropy --rows 1,8,9,32 \
  --sources "committed,recorded~few_fin=launch" --dtypes bfloat16,float32 > "$OUT/logs/ce_fin.log" 2>&1
log "decode_ab cross_entropy few_fin cluster vs launch: exit $?"
grep -E "^cross_entropy" "$OUT/logs/ce_fin.log" | sed -e 's/  */ /g' | cut -c1-220 >> "$OUT/summary.txt"
work=$(mktemp -d /tmp/s17c.XXXX)
timeout 120 python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  (cd "$work" && PYTHONPATH="$work/site:$PYTHONPATH" timeout 100 python3 -m pytest -q -p no:cacheprovider -rs \
    --pyargs specgen_kernels.tests -k "softmax or cross_entropy" > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated tests (softmax, cross_entropy): exit $? $(tail -1 "$OUT/logs/generated_tests.log")"
  PYTHONPATH="$work/site:$PYTHONPATH" timeout 120 python3 benchmarks/liger_ops.py --package specgen_kernels \
    --ops softmax,cross_entropy --shapes 8x4096,16384x4096,4096x8192 --dtypes bfloat16,float32 --out "$OUT/liger_ops.json" > "$OUT/logs/liger_ops.log" 2>&1
  log "liger_ops softmax, cross_entropy: exit $?"; grep -E "^\| (softmax|cross)" "$OUT/logs/liger_ops.log" | cut -c1-200 >> "$OUT/summary.txt"
fi
level1() {  # level1 NAME SECONDS: a held-out problem on the user's path
  local t=$2
  LEVEL1_SETS=heldout LEVEL1_ONLY=$1 LEVEL1_BUDGET_S=$(( t - 20 )) LEVEL1_HELDOUT_S=$(( t - 20 )) \
    LEVEL1_SPEC_BUDGET_S=$(( t - 25 )) timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_$1.log" 2>&1
  log "level1 heldout $1: exit $?"
  mkdir -p "$OUT/level1_$1" && cp -r "$OUT"/level1/heldout/* "$OUT/level1_$1/" 2>/dev/null
  grep -E "^\| [a-z]" "$OUT"/level1/heldout/level1_bench.md 2>/dev/null | cut -c1-240 | head -30 >> "$OUT/summary.txt"
  rm -rf "$OUT/level1"
}
t=$(( $(left) - 10 )); [ $t -gt 150 ] && t=150
[ $t -gt 80 ] && level1 hardswish $t
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt --exclude specs_after.tgz . && find "$OUT" -mindepth 1 ! -name summary.txt ! -name specs_after.tgz -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cut -c1-260 "$OUT/summary.txt"
