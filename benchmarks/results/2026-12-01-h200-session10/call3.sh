#!/usr/bin/env bash
# Session 10, call 3 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. the verifier on the workspace attacks (tests/adversarial/*workspace*) and the good kernel
#      that takes its workspace from the framework (pytest -m gpu, expected verdicts in the tests);
#   2. the user's path with the ABI's workspace: `specgen build` of a copy of specs/ whose rmsnorm
#      has no kernel and no lock entry (the builtin agent's default variant, verified, through the
#      sanitizer gate, locked; the others come from the lock; --no-tune, since this session's
#      generator changes would re-tune every op), the wheel installed, its rmsnorm tests;
#   3. benchmarks/liger_ops.py: device time beside Liger-Kernel, eager, torch.compile (bf16);
#   4. level 1: frobenius_norm (its backward reads the stored norm now); elu_probe.py (the 16-bit expm1);
#   5. benchmarks/host_overhead.py at decode sizes, if time is left.
# One tarball and summary.txt come back.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-575} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }

# 1. workspace attacks and the good workspace kernel (their expected verdicts are in the tests),
#    and the axis kernels' bit-reproducibility with the workspace handed to them
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_adversarial.py tests/test_axis_reduce.py \
  -k "workspace or bit_reproducible" -rA > "$OUT/logs/workspace_tests.log" 2>&1
log "workspace GPU tests: exit $? $(tail -1 "$OUT/logs/workspace_tests.log")"
grep -E "PASSED|FAILED|ERROR" "$OUT/logs/workspace_tests.log" | cut -c1-160 | head -12 >> "$OUT/summary.txt"

# 2. the user's path, rmsnorm regenerated through the workspace
work=$(mktemp -d /tmp/s10.XXXX); cp -r specs "$work/specs"; rm -f "$work/specs/kernels/rmsnorm.cu"
python3 - "$work/specs/specgen.lock" <<'PY'
import json, sys
lock = json.load(open(sys.argv[1])); lock["ops"].pop("rmsnorm"); json.dump(lock, open(sys.argv[1], "w"), indent=1)
PY
timeout 330 python3 -m specgen build "$work/specs" -o "$work/dist" --name specgen_kernels --no-tune > "$OUT/logs/build.log" 2>&1
log "build with rmsnorm regenerated: exit $?"
grep -E "rmsnorm|sanitiz|wrote|locked|chosen|decision" "$OUT/logs/build.log" | cut -c1-200 | head -14 >> "$OUT/summary.txt"
cp "$work/specs/kernels/rmsnorm.cu" "$work/specs/specgen.lock" "$OUT/logs/" 2>/dev/null
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  export PYTHONPATH="$work/site:$PYTHONPATH"
  (cd "$work" && timeout 150 python3 -m pytest -q -p no:cacheprovider -k rmsnorm --pyargs specgen_kernels.tests > "$OUT/logs/generated_tests.log" 2>&1)
  log "generated rmsnorm tests: $(tail -1 "$OUT/logs/generated_tests.log")"
  # 3. Liger
  t=$(( $(left) - 150 )); [ $t -gt 200 ] && t=200
  [ $t -gt 40 ] && timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels --dtypes bfloat16 \
    --shapes 16384x4096,8x4096 --out "$OUT/liger_ops.json" > "$OUT/logs/liger_ops.log" 2>&1
  log "liger_ops: exit $?"; grep -E "^\S+ +forward" "$OUT/logs/liger_ops.log" | head -30 >> "$OUT/summary.txt"
fi

# 4. frobenius_norm on the level-1 path
t=$(( $(left) - 20 )); [ $t -gt 130 ] && t=130
[ $t -gt 60 ] && LEVEL1_SETS=dev LEVEL1_ONLY=frobenius_norm LEVEL1_BUDGET_S=$(( t - 25 )) \
  timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1.log" 2>&1
log "level1 frobenius_norm: exit $?"; grep -E "^\| frobenius_norm \|" "$OUT/level1/dev/level1_bench.md" 2>/dev/null | cut -c1-200 >> "$OUT/summary.txt"

# 4b. the fast 16-bit expm1 (elu): verified, and its bandwidth beside neg()
t=$(( $(left) - 10 )); [ $t -gt 90 ] && t=90
[ $t -gt 30 ] && timeout $t python3 benchmarks/results/2026-12-01-h200-session10/elu_probe.py > "$OUT/logs/elu_probe.log" 2>&1
log "elu probe: exit $?"; grep -E "^elu" "$OUT/logs/elu_probe.log" >> "$OUT/summary.txt"

# 5. host overhead
t=$(( $(left) - 10 ))
[ -n "$wheel" ] && [ $t -gt 40 ] && timeout $t python3 benchmarks/host_overhead.py --package specgen_kernels \
  --out "$OUT/host_overhead.json" > "$OUT/logs/host_overhead.log" 2>&1
log "host_overhead: exit $?"; tail -12 "$OUT/logs/host_overhead.log" >> "$OUT/summary.txt"

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call3.tgz"
cat "$OUT/summary.txt" | cut -c1-300
