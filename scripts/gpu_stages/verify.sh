# Stage `verify`: the verifier on the GPU (scripts/gpu_stages/verify_suite.py): every adversarial
# kernel rejected for its reason, the good and the committed kernels pass, the held-out attacks
# counted, the warm-worker timing alone and 4 in parallel, the benchmark's checked path.
# Then the GPU unit tests. Runs under scripts/gpu-suite: $STAGE_OUT is this stage's result folder.
set -uo pipefail
GROUPS_TO_RUN="${VERIFY_GROUPS:-good,adversarial,committed,heldout}"
timeout "${VERIFY_SUITE_S:-420}" python3 scripts/gpu_stages/verify_suite.py --json "$STAGE_OUT/verify-suite.json" \
  --groups "$GROUPS_TO_RUN" ${VERIFY_TIMING:+--timing} ${VERIFY_BENCH:+--bench} 2>&1 | tee "$STAGE_OUT/verify-suite.log"
rc=${PIPESTATUS[0]}
if [ -n "${VERIFY_PYTEST:-}" ]; then
  timeout 240 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_verify_gpu.py tests/test_bench.py \
    --junitxml="$STAGE_OUT/junit.xml" 2>&1 | tee "$STAGE_OUT/pytest.log" | tail -30
fi
exit $rc
