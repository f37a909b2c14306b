# Stage `verify`: the verifier on the GPU (scripts/gpu_stages/verify_suite.py), in three
# processes side by side (verification leaves the GPU mostly idle): (1) the warm-worker timing,
# alone then 4 in parallel, then the good kernels; (1b) the ten committed kernels; (2) the project's
# adversarial kernels, then the benchmark's checked path; (3) the held-out attacks. (2) and (3)
# start after the timing is done. Runs under scripts/gpu-suite: $STAGE_OUT is its result folder.
set -uo pipefail
S="${VERIFY_SUITE_S:-500}"
suite() { timeout "$S" python3 scripts/gpu_stages/verify_suite.py "$@"; }
suite --json "$STAGE_OUT/main.json" --groups good --timing > "$STAGE_OUT/main.log" 2>&1 &
a=$!
sleep "${VERIFY_STAGGER_S:-80}"
suite --json "$STAGE_OUT/committed.json" --groups committed > "$STAGE_OUT/committed.log" 2>&1 &
d=$!
suite --json "$STAGE_OUT/adversarial.json" --groups adversarial --bench > "$STAGE_OUT/adversarial.log" 2>&1 &
b=$!
if [ -d heldout/attacks ]; then
  suite --json "$STAGE_OUT/heldout.json" --groups heldout > "$STAGE_OUT/heldout.log" 2>&1 &
  c=$!
fi
wait $a; ra=$?; wait $b; rb=$?; wait $d; rd=$?; [ -n "${c:-}" ] && wait $c
for f in main committed adversarial heldout; do [ -f "$STAGE_OUT/$f.log" ] && sed -n '/== summary/,$p' "$STAGE_OUT/$f.log"; done
grep -h " NO " "$STAGE_OUT"/*.log | cut -c1-150
exit $(( ra || rb || rd ))
