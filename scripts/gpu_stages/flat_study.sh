# Stage `flat_study`: benchmarks/flat_study.py over FLAT_SPECS (default: the imported residual SiLU
# and the level-1 ReLU at its benchmark shape): the built-in flat pointwise kernel under several
# launch shapes (chunks in flight per thread x waves of blocks), timed plainly and through the
# verifier's harness, beside eager. Results: $STAGE_OUT/<spec>.json and .log.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${STAGE_OUT:-${OUT:-/tmp/flat-study-out}/flat_study}"
mkdir -p "$OUT_DIR"
cd "$REPO"
status=0
for spec in ${FLAT_SPECS:-tests/report_reference_kept/residual_silu_model.yaml benchmarks/level1/specs/relu.yaml}; do
  name=$(basename "$spec" .yaml)
  echo "== flat_study $name"
  timeout "${FLAT_SPEC_S:-200}" python3 benchmarks/flat_study.py "$spec" --out "$OUT_DIR/$name.json" 2>&1 \
    | tee "$OUT_DIR/$name.log" | grep -v "^\[" || status=1
done
exit $status
