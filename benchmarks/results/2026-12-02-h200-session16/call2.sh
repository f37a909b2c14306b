#!/usr/bin/env bash
# Session 16, call 2 (~540 s of command):
#   1. gelu_tanh regenerated at the default variant (the flat grid uncapped: aten's shape) and
#      cross_entropy at `few:fewtwo+medium:cl256+split:cl256` (its recorded cl256 with few-row
#      forwards as a block of two exact rounds; its row-free backward keeps the clusters):
#      builtin_bench.py --write-lock (verify, time, lock);
#   2. the wheel of the lock (`build --locked --sdist`), its generated tests of those two ops,
#      host_overhead.py (host time per call at decode sizes) and liger_ops.py cross_entropy;
#   3. softmax at 16384 x 4096: the medium rows' two exact rounds (`twopass`) against the committed.
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
CE="few:fewtwo+medium:cl256+split:cl256"
timeout 300 python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops gelu_tanh,cross_entropy --variants "gelu_tanh=default;cross_entropy=$CE" > "$OUT/logs/builtin.log" 2>&1
log "builtin gelu_tanh, cross_entropy (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED|Error|refus" "$OUT/logs/builtin.log" | cut -c1-200 | head -6 >> "$OUT/summary.txt"
python3 -c "
import json,sys
for op, d in json.load(open(sys.argv[1]))['ops'].items(): print(op, d.get('variant'), [n[:160] for n in d.get('notes', [])])" \
  "$OUT/builtin/builtin_bench.json" >> "$OUT/summary.txt" 2>&1
grep -E "^\| (gelu_tanh|cross_entropy) " "$OUT/builtin/builtin_bench.md" 2>/dev/null | cut -c1-200 >> "$OUT/summary.txt"
git status --short specs >> "$OUT/summary.txt"
tar czf "$OUT/specs_after.tgz" specs/kernels/gelu_tanh.cu specs/kernels/cross_entropy.cu specs/specgen.lock
work=$(mktemp -d /tmp/s16c.XXXX)
timeout 120 python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked --sdist > "$OUT/logs/build.log" 2>&1
log "build --locked --sdist: exit $?"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  (cd "$work" && PYTHONPATH="$work/site:$PYTHONPATH" timeout 100 python3 -m pytest -q -p no:cacheprovider -rs \
    --pyargs specgen_kernels.tests -k "gelu_tanh or cross_entropy" > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated tests (gelu_tanh, cross_entropy): exit $? $(tail -1 "$OUT/logs/generated_tests.log")"
  PYTHONPATH="$work/site:$PYTHONPATH" timeout 120 python3 benchmarks/host_overhead.py --package specgen_kernels \
    --out "$OUT/host_overhead.json" > "$OUT/logs/host_overhead.log" 2>&1
  log "host_overhead: exit $?"; grep -E "^\||target" "$OUT/logs/host_overhead.log" | cut -c1-200 >> "$OUT/summary.txt"
  t=$(( $(left) - 45 )); [ $t -gt 90 ] && t=90
  [ $t -gt 20 ] && PYTHONPATH="$work/site:$PYTHONPATH" timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels \
    --ops cross_entropy --shapes 8x4096,16384x4096,4096x8192 --dtypes bfloat16,float32 --out "$OUT/liger_ce.json" > "$OUT/logs/liger_ce.log" 2>&1
  log "liger_ops cross_entropy: exit $?"; grep -E "^\| cross" "$OUT/logs/liger_ce.log" | cut -c1-200 >> "$OUT/summary.txt"
fi
R="few:fewtwo+medium:cl256+split:default+wide:cl256"
t=$(( $(left) - 5 )); [ $t -gt 60 ] && t=60
[ $t -gt 30 ] && timeout $t python3 benchmarks/decode_ab.py --out "$OUT/softmax_twopass" --ops softmax --rows 16384 --hidden 4096 \
  --sources "committed,$R~reg_pair=twopass" --dtypes bfloat16 > "$OUT/logs/softmax_twopass.log" 2>&1
log "softmax twopass: exit $?"; sed -e "s/$R/R/g" "$OUT/logs/softmax_twopass.log" | grep -E "^softmax" | cut -c1-250 >> "$OUT/summary.txt"
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt --exclude specs_after.tgz . && find "$OUT" -mindepth 1 ! -name summary.txt ! -name specs_after.tgz -delete && mv /tmp/call.tgz "$OUT/call2.tgz"
cut -c1-260 "$OUT/summary.txt"
