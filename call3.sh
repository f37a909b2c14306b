set -u
export VERIFY_SUITE_S=535 VERIFY_PROFILE_DIR=/tmp/o/verify/prof
OUT_FINAL=$OUT
OUT=/tmp/o bash scripts/gpu-suite verify 2>&1 | tail -60
git rev-parse HEAD > /tmp/o/commit.txt 2>/dev/null
cd /tmp/o && tar czf $OUT_FINAL/verify-run4.tgz . && cp verify/main.json $OUT_FINAL/ 2>/dev/null; ls $OUT_FINAL
