#!/usr/bin/env bash
# Session 21, call 1 (~540 s of command): confirm on the GPU what session 20 wrote on the CPU only.
#   verify (three streams, verdicts only, ~150 s):
#     - development adversarial kernels that play with NaN/inf or backward values (the new
#       alternative-truth rule must not let one through);
#     - held-out attacks-v2/v3 kernels of the pointwise specs (gelu_tanh, swiglu, bias_gelu), same reason.
#   heldout3-confirm: held-out v3's CELU (scalar-derived constants) and softshrink (alternative truth)
#     problems and its two scan problems that were not reached in session 20 (all four spoiled:
#     confirmation of fixes only, not a held-out measurement).
set -uo pipefail
started=$(date +%s)
CALL_S=${CALL_S:-540}
left() { echo $(( CALL_S - ($(date +%s) - started) )); }
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
V=${VERIFY_S:-170}
timeout $V python3 scripts/gpu_stages/verify_suite.py --json "$OUT/logs/adversarial-nan.json" --groups adversarial \
  --only nan_inf_to_zero flushes_huge_to_zero fp16_math wrong_backward gelu_tanh_approx_ptx drops_tail sniffs_bf16_upcast \
  > "$OUT/logs/adversarial-nan.log" 2>&1 &
timeout $V python3 heldout/run_attacks_v2.py heldout/attacks-v2 --only gelu_tanh_ swiglu_ --no-bench --timeout $V \
  --out "$OUT/logs/heldout-v2-pointwise.json" > "$OUT/logs/heldout-v2-pointwise.log" 2>&1 &
timeout $V python3 heldout/run_attacks_v2.py heldout/attacks-v3 --only gelu_tanh_ swiglu_ bias_gelu_ --no-bench --timeout $V \
  --out "$OUT/logs/heldout-v3-pointwise.json" > "$OUT/logs/heldout-v3-pointwise.log" 2>&1 &
wait
log "verify streams done"
grep "^adversarial" "$OUT/logs/adversarial-nan.log" | cut -c1-200 >> "$OUT/summary.txt"
for f in heldout-v2-pointwise heldout-v3-pointwise; do echo "== $f" >> "$OUT/summary.txt"; grep -v "^file" "$OUT/logs/$f.log" | cut -c1-160 >> "$OUT/summary.txt"; done
t=$(( $(left) - 15 ))
LEVEL1_SETS=heldout LEVEL1_HELDOUT_DIR=heldout/problems-v3 LEVEL1_ONLY=celu_3d,softshrink,cumsum_dim0,logcumsumexp_dim1 \
  LEVEL1_BUDGET_S=$(( t - 25 )) LEVEL1_HELDOUT_S=$(( t - 25 )) LEVEL1_SPEC_BUDGET_S=80 timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_v3confirm.log" 2>&1
log "level1 heldout v3 confirm: exit $?"
mkdir -p "$OUT/v3confirm" && cp -r "$OUT"/level1/heldout/* "$OUT/v3confirm/" 2>/dev/null
grep -vE "^\[level1\] spec " "$OUT/level1/heldout.log" 2>/dev/null | tail -30 | cut -c1-200 >> "$OUT/summary.txt"
rm -rf "$OUT/level1"
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call.tgz"
cut -c1-220 "$OUT/summary.txt"
