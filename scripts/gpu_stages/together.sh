# Stage `together`: runs stage chains at once, for work that shares the GPU through specgen's GPU
# lock (verifications beside a build and timings that take the GPU alone). TOGETHER_STAGES lists
# the chains, space-separated; a chain is stage names joined by '+', run one after another, e.g.
#   TOGETHER_STAGES="verify host_overhead+level1" scripts/gpu-suite together
# Each stage writes under $STAGE_OUT/<stage>/ and logs to $STAGE_OUT/<stage>.log; the tails of
# the logs are printed at the end, in the order of TOGETHER_STAGES.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT_DIR="${STAGE_OUT:-${OUT:-/tmp/together-out}/together}"
mkdir -p "$OUT_DIR"
chain() {
  local rc=0 stage
  for stage in ${1//+/ }; do
    mkdir -p "$OUT_DIR/$stage"
    local started=$(date +%s)
    STAGE_OUT="$OUT_DIR/$stage" bash "$HERE/$stage.sh" > "$OUT_DIR/$stage.log" 2>&1 || rc=1
    echo "== $stage: exit ${rc} after $(( $(date +%s) - started )) s" >> "$OUT_DIR/$stage.log"
  done
  return $rc
}
pids=()
for c in ${TOGETHER_STAGES:?name the stage chains in TOGETHER_STAGES}; do
  chain "$c" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for c in $TOGETHER_STAGES; do
  for stage in ${c//+/ }; do echo "=== $stage"; tail -n "${TOGETHER_TAIL:-30}" "$OUT_DIR/$stage.log"; done
done
exit $status
