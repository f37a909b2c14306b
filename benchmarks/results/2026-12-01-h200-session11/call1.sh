#!/usr/bin/env bash
# Session 11, call 1 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. the user's path through the sanitizer gate: `specgen build` of a copy of specs/ whose rmsnorm
#      has no kernel and no lock entry (--no-tune: the builtin agent's default variant, verified,
#      sanitized (racecheck warnings recorded, errors refuse), locked), the wheel installed, its
#      rmsnorm tests;
#   2. benchmarks/liger_ops.py on that wheel: bf16 and float32, [16384 x 4096] and decode [8 x 4096],
#      each row's longest kernels in the JSON (what a decode step is made of);
#   3. elu_probe.py (the 16-bit expm1/log1p; the timed phase's memory retry at 13 GB).
# One tarball and summary.txt come back.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git log --oneline -1 >> "$OUT/summary.txt" 2>/dev/null

# 1. the user's path, rmsnorm regenerated through the gate
work=$(mktemp -d /tmp/s11.XXXX); cp -r specs "$work/specs"; rm -f "$work/specs/kernels/rmsnorm.cu"
python3 - "$work/specs/specgen.lock" <<'PY'
import json, sys
lock = json.load(open(sys.argv[1])); lock["ops"].pop("rmsnorm"); json.dump(lock, open(sys.argv[1], "w"), indent=1)
PY
timeout 280 python3 -m specgen build "$work/specs" -o "$work/dist" --name specgen_kernels --no-tune > "$OUT/logs/build.log" 2>&1
log "build with rmsnorm regenerated: exit $?"
grep -E "rmsnorm|sanitiz|racecheck|wrote|locked|chosen|decision|built" "$OUT/logs/build.log" | cut -c1-220 | head -14 >> "$OUT/summary.txt"
cp "$work/specs/kernels/rmsnorm.cu" "$work/specs/specgen.lock" "$OUT/logs/" 2>/dev/null
python3 - "$work/specs/specgen.lock" >> "$OUT/summary.txt" 2>&1 <<'PY'
import json, sys
entry = json.load(open(sys.argv[1]))["ops"].get("rmsnorm") or {}
ver = ((entry.get("records") or [{}])[0]).get("verification") or {}
print("rmsnorm lock: kernel", bool(entry.get("kernel")), "sanitized", ver.get("sanitized"), "sanitize_s", ver.get("sanitize_s"),
      "notes", str(ver.get("sanitizer_notes") or ver.get("sanitizer") or "")[:200])
PY
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  export PYTHONPATH="$work/site:$PYTHONPATH"
  (cd "$work" && timeout 100 python3 -m pytest -q -p no:cacheprovider -k rmsnorm --pyargs specgen_kernels.tests > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated rmsnorm tests: $(tail -1 "$OUT/logs/generated_tests.log")"
  # 2. Liger, eager, compile: device time, with each row's kernels
  t=$(( $(left) - 90 )); [ $t -gt 260 ] && t=260
  [ $t -gt 40 ] && timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels --dtypes bfloat16,float32 \
    --shapes 8x4096,16384x4096 --out "$OUT/liger_ops.json" > "$OUT/logs/liger_ops.log" 2>&1
  log "liger_ops: exit $?"; grep -E "^\S+ +forward" "$OUT/logs/liger_ops.log" | head -48 >> "$OUT/summary.txt"
fi

# 3. the fast 16-bit expm1 (elu): verified, and its bandwidth beside neg()
t=$(( $(left) - 10 )); [ $t -gt 120 ] && t=120
[ $t -gt 30 ] && timeout $t python3 benchmarks/results/2026-12-01-h200-session10/elu_probe.py > "$OUT/logs/elu_probe.log" 2>&1
log "elu probe: exit $?"; grep -E "^elu" "$OUT/logs/elu_probe.log" >> "$OUT/summary.txt"; tail -3 "$OUT/logs/elu_probe.log" | cut -c1-300 >> "$OUT/summary.txt"

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cat "$OUT/summary.txt" | cut -c1-300
