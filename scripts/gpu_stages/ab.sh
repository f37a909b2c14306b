# Stage `ab`: builtin schedule variants of the same kernels timed side by side
# (benchmarks/variant_ab.py; kernel only, nothing locked): for choosing defaults.
# Knobs: AB_OPS (default gelu_tanh,swiglu,rmsnorm,softmax), AB_A (default: default), AB_B (one or more,
# comma-separated; default: wave; empty with AB_VERIFY=1: verify only), AB_VERIFY=1 (run the verifier on
# A and each B first), AB_TIMEOUT (s).
set -uo pipefail
OUT_DIR="${STAGE_OUT:-$OUT/ab}"
mkdir -p "$OUT_DIR"
VERIFY_FLAG=""
[ "${AB_VERIFY:-0}" = "1" ] && VERIFY_FLAG="--verify"
timeout "${AB_TIMEOUT:-240}" python3 benchmarks/variant_ab.py --out "$OUT_DIR" \
  --ops "${AB_OPS:-gelu_tanh,swiglu,rmsnorm,softmax}" --a "${AB_A:-default}" --b "${AB_B-wave}" \
  --extra-shapes $VERIFY_FLAG 2>&1 | tee "$OUT_DIR/ab.log"
exit "${PIPESTATUS[0]}"
