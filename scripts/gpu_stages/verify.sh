# Stage `verify`: the verifier's GPU tests (every adversarial kernel rejected for its reason,
# the good kernels pass, the timing targets), then a JSON summary and a short table.
# Runs under scripts/gpu-suite: $STAGE_OUT is this stage's result folder.
set -uo pipefail
export SPECGEN_VERIFY_SUMMARY="$STAGE_OUT/verify-summary.json"
rm -f "$SPECGEN_VERIFY_SUMMARY"
# Stop well before the 10-minute limit even if something hangs.
timeout 540 python3 -m pytest -q -rfEs -p no:cacheprovider \
  tests/test_verify_gpu.py tests/test_adversarial.py tests/test_bench.py \
  tests/test_verify_engine.py tests/test_verify_compare.py \
  --junitxml="$STAGE_OUT/junit.xml" 2>&1 | tee "$STAGE_OUT/pytest.log" | tail -60
rc=${PIPESTATUS[0]}
python3 scripts/gpu_stages/verify_table.py "$SPECGEN_VERIFY_SUMMARY" || true
exit $rc
