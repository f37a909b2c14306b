# Stage `ab`: two builtin schedule variants of the same kernels timed side by side
# (benchmarks/variant_ab.py; kernel only, nothing verified or locked): for choosing defaults.
# Knobs: AB_OPS (default gelu_tanh,swiglu,rmsnorm,softmax), AB_A (default: default), AB_B
# (default: grid), AB_TIMEOUT (s).
set -uo pipefail
OUT_DIR="${STAGE_OUT:-$OUT/ab}"
mkdir -p "$OUT_DIR"
timeout "${AB_TIMEOUT:-240}" python3 benchmarks/variant_ab.py --out "$OUT_DIR" \
  --ops "${AB_OPS:-gelu_tanh,swiglu,rmsnorm,softmax}" --a "${AB_A:-default}" --b "${AB_B:-grid}" \
  --extra-shapes 2>&1 | tee "$OUT_DIR/ab.log"
exit "${PIPESTATUS[0]}"
