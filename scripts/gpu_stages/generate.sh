# Stage `generate`: the user's own path on chosen specs, then their timings:
#   specgen generate $GENERATE_SPECS $GENERATE_ARGS   (tunes, verifies, sanitizes, writes the lock)
#   specgen bench SPEC --kernel kernels/OP.cu --json   (each spec, beside eager and torch.compile)
# GENERATE_SPECS: spec files (default: all of specs/); GENERATE_ARGS e.g. "--tune-budget 150 --gpus all".
# Results: $STAGE_OUT/{generate.log,generate.json,bench_<op>.{log,json}}, $STAGE_OUT/specs/specgen.lock
# and $STAGE_OUT/kernels/ (the lock and kernels to commit).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"
export PYTHONUNBUFFERED=1
SPECS="${GENERATE_SPECS:-specs}"
status=0
# shellcheck disable=SC2086  # word splitting of the lists is wanted
timeout "${GENERATE_TIMEOUT:-420}" python3 -m specgen generate $SPECS ${GENERATE_ARGS:-} \
  --json "$STAGE_OUT/generate.json" 2>&1 | tee "$STAGE_OUT/generate.log"
[ "${PIPESTATUS[0]}" -ne 0 ] && status=1
mkdir -p "$STAGE_OUT/specs" "$STAGE_OUT/kernels"  # $OUT brings back folders only so deep
cp specs/specgen.lock "$STAGE_OUT/specs/"
cp specs/kernels/*.cu "$STAGE_OUT/kernels/" 2>/dev/null
# each spec's bench on its own GPU where there are several (one after another on one GPU)
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l); [ "$gpus" -ge 1 ] || gpus=1
bench_one() {  # spec, gpu
  local spec=$1 op kernel
  op=$(basename "$spec" .yaml)
  kernel="$(dirname "$spec")/kernels/$op.cu"
  [ -f "$kernel" ] || { echo "bench $op: no $kernel"; return 1; }
  CUDA_VISIBLE_DEVICES=$2 timeout "${GENERATE_BENCH_TIMEOUT:-150}" python3 -m specgen bench "$spec" \
    --kernel "$kernel" --json "$STAGE_OUT/bench_$op.json" > "$STAGE_OUT/bench_$op.log" 2>&1 \
    || { echo "bench $op failed"; return 1; }
}
if [ "${GENERATE_BENCH:-1}" = "1" ]; then
  i=0; pids=()
  for spec in $SPECS; do
    [ -f "$spec" ] || continue
    bench_one "$spec" $((i % gpus)) & pids+=($!)
    i=$((i + 1))
    if [ $((i % gpus)) -eq 0 ]; then for p in "${pids[@]}"; do wait "$p" || status=1; done; pids=(); fi
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  for log in "$STAGE_OUT"/bench_*.log; do [ -f "$log" ] && { echo "== $log"; tail -25 "$log"; }; done
fi
exit $status
