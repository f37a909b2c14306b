# Stage `release`: what a session commits after a generator change, in one GPU call:
#   1. the builtin stage with BUILTIN_WRITE_LOCK=1: verify every example kernel on this GPU,
#      time it (forward and backward, bf16 and float32) and write the records into specs/;
#   2. the LLM loop end to end against scripted answers (scripts/llm_e2e.py);
#   3. the package stage from the lock just written (`specgen build --locked`), its generated
#      tests and the model-level check.
# Results: $STAGE_OUT/{builtin,llm,package}/ and specs/ (kernels + lock to commit).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"
status=0
mkdir -p "$STAGE_OUT/builtin" "$STAGE_OUT/llm" "$STAGE_OUT/package"
echo "== release 1/3: builtin (verify, time, lock)"
BUILTIN_WRITE_LOCK=1 BUILTIN_TIMEOUT="${RELEASE_BUILTIN_TIMEOUT:-330}" STAGE_OUT="$STAGE_OUT/builtin" \
  bash "$HERE/builtin.sh" > "$STAGE_OUT/builtin/stage.log" 2>&1 || status=1
tail -4 "$STAGE_OUT/builtin/stage.log"
cp -r specs "$STAGE_OUT/specs"
echo "== release 2/3: LLM loop end to end"
timeout 120 python3 scripts/llm_e2e.py --out "$STAGE_OUT/llm" > "$STAGE_OUT/llm/llm_e2e.log" 2>&1 || status=1
tail -3 "$STAGE_OUT/llm/llm_e2e.log"
echo "== release 3/3: package from the lock"
PACKAGE_FROM_LOCK=1 PACKAGE_BUILD_ARGS="${RELEASE_PACKAGE_ARGS:---no-verify}" STAGE_OUT="$STAGE_OUT/package" \
  bash "$HERE/package.sh" || status=1
echo "== release: builtin table"
grep -E "^\| |geometric" "$STAGE_OUT/builtin/builtin_bench.md" 2>/dev/null | cut -c1-150 | tail -60
exit $status
