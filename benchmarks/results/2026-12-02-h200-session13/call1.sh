#!/usr/bin/env bash
# Session 13, call 1 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. leading batch dims on the GPU (CPU-tested in session 12): `specgen build tests/batch_specs`
#      (the built-in agent generates and verifies rmsnorm_batched and add_batched; no tuning), the
#      wheel's generated tests (the C++ composite op: fold, `<op>_rows`, unfold, autograd,
#      torch.compile), then benchmarks/batch_overhead.py (host time per call of the public op on
#      [1, rows, D] beside its rows op and eager; outputs and gradients against the rows op);
#   2. benchmarks/rsqrt_ab.py: the prelude's rsqrtf against 1.f / sqrtf on float32 norms at `huge`
#      inputs, 24 seeds, and layernorm_hw_affine through the verifier with each;
#   3. benchmarks/decode_profile.py: every kernel of one softmax forward call at 1 and 8 rows of 4096
#      (ours: committed, nofew, fewblock; torch; Liger), with grid, block, cluster, registers.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-550} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

work=$(mktemp -d /tmp/s13.XXXX)
cp -r tests/batch_specs "$work/batch_specs"
timeout 230 python3 -m specgen build "$work/batch_specs" -o "$work/dist" --name specgen_batch --no-tune \
  > "$OUT/logs/batch_build.log" 2>&1
log "batch build: exit $?"; tail -4 "$OUT/logs/batch_build.log" | cut -c1-200 >> "$OUT/summary.txt"
cp -r "$work/batch_specs" "$OUT/batch_specs_after_build"
wheel=$(ls "$work"/dist/specgen_batch-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  (cd "$work" && PYTHONPATH="$work/site:$PYTHONPATH" timeout 100 python3 -m pytest -q -p no:cacheprovider -rs \
     --pyargs specgen_batch.tests > "$OUT/logs/batch_generated_tests.log" 2>&1)
  log "batch generated tests: $(tail -1 "$OUT/logs/batch_generated_tests.log")"
  grep -E "leading_dims|binding_implements" "$OUT/logs/batch_generated_tests.log" | head -5 >> "$OUT/summary.txt"
  PYTHONPATH="$work/site:$PYTHONPATH" timeout 90 python3 benchmarks/batch_overhead.py --package specgen_batch \
    --op rmsnorm_batched --out "$OUT" > "$OUT/logs/batch_overhead.log" 2>&1
  log "batch overhead: exit $?"; cat "$OUT/logs/batch_overhead.log" | cut -c1-250 >> "$OUT/summary.txt"
fi

t=$(( $(left) - 75 )); [ $t -gt 170 ] && t=170
timeout $t python3 benchmarks/rsqrt_ab.py --out "$OUT" > "$OUT/logs/rsqrt_ab.log" 2>&1
log "rsqrt_ab: exit $?"; grep -v "^\[" "$OUT/logs/rsqrt_ab.log" | tail -12 | cut -c1-250 >> "$OUT/summary.txt"

t=$(( $(left) - 8 )); [ $t -gt 90 ] && t=90
[ $t -gt 20 ] && timeout $t python3 benchmarks/decode_profile.py --out "$OUT" > "$OUT/logs/decode_profile.log" 2>&1
log "decode_profile: exit $?"; cut -c1-200 "$OUT/logs/decode_profile.log" | tail -60 >> "$OUT/summary.txt"

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cut -c1-250 "$OUT/summary.txt"
