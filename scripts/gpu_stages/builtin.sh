# Stage `builtin`: the builtin generator on every example spec (all but the matmul one):
# generate, verify, autotune, then time forward and backward beside eager and
# torch.compile (bf16 and float32), writing $STAGE_OUT/builtin_bench.{json,md}.
# Split by op with BUILTIN_OPS=softmax,rmsnorm; BUILTIN_TUNE=1 adds the autotuner (every variant of
# specgen/agents/builtin/emit.py VARIANTS per op, or BUILTIN_VARIANTS=default,twopass,wave);
# BUILTIN_WRITE_LOCK=1 writes the verification and benchmark records into specs/specgen.lock.
# Regenerating the committed kernels: BUILTIN_TUNE=1 BUILTIN_WRITE_LOCK=1 BUILTIN_VARIANTS=recorded (each op
# at the variant its lock entry records), then take specs/kernels and the lock from $STAGE_OUT/specs.
set -uo pipefail
OUT_DIR="${STAGE_OUT:-$OUT/builtin}"
mkdir -p "$OUT_DIR"
OPS="${BUILTIN_OPS:-gelu_tanh,bias_gelu,swiglu,layernorm_gelu,rmsnorm,add_rmsnorm,softmax,log_softmax,cross_entropy,rope}"
TUNE_FLAG=""
[ "${BUILTIN_TUNE:-0}" = "0" ] && TUNE_FLAG="--no-tune"  # autotuning all ops: BUILTIN_TUNE=1, split by BUILTIN_OPS
VARIANTS_FLAG=""
[ -n "${BUILTIN_VARIANTS:-}" ] && VARIANTS_FLAG="--variants $BUILTIN_VARIANTS"  # with BUILTIN_TUNE=1: only these
LOCK_FLAG=""
[ "${BUILTIN_WRITE_LOCK:-0}" = "1" ] && LOCK_FLAG="--write-lock"  # verification + benchmark records into specs/
timeout "${BUILTIN_TIMEOUT:-560}" python3 benchmarks/builtin_bench.py --out "$OUT_DIR" --ops "$OPS" \
  --dtypes bfloat16,float32 --extra-shapes $TUNE_FLAG $VARIANTS_FLAG $LOCK_FLAG 2>&1 | tee "$OUT_DIR/builtin.log"
status=${PIPESTATUS[0]}
[ -f "$OUT_DIR/builtin_bench.md" ] && cat "$OUT_DIR/builtin_bench.md"
if [ "${BUILTIN_WRITE_LOCK:-0}" = "1" ]; then  # what was written, to bring back (the checkout here is a copy)
  mkdir -p "$OUT_DIR/specs" && cp -r specs/kernels specs/specgen.lock "$OUT_DIR/specs/"
fi
exit $status
