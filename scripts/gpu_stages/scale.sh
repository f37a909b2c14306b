# Stage `scale`: `specgen build` of the ten example specs from a clean state (no lock, an empty
# compile cache, autotuning on) with --gpus 0, then --gpus all (and --gpus all --backend dask
# with SCALE_CONFIGS=dask), wall times and whether the locks agree; writes
# $STAGE_OUT/scale_bench.{json,md}. Needs 2+ GPUs for a speed-up. The Dask config needs dask +
# distributed (+ their pure-Python dependencies) carried as wheels in .whl-dask/ (scripts/gpu-suite
# installs them): pip download --only-binary=:all: -d .whl dask distributed
# One call is limited to 10 minutes: split the configs over calls (SCALE_CONFIGS=gpus0, then
# SCALE_CONFIGS=all,dask) on the same warm machine; the runs are merged through
# gpu-out/scale_state.json (SCALE_FRESH=1 forgets them). SCALE_COMMAND=generate skips the wheel.
# SCALE_EXTRA: options for every run (default "--tune-budget 30": the tuner's default of 240 s
# per spec would put a clean 1-GPU build of ten specs past one call's limit).
set -uo pipefail
OUT_DIR="${STAGE_OUT:-$OUT/scale}"
mkdir -p "$OUT_DIR"
SPECS_FLAG=""
[ -n "${SCALE_SPECS:-}" ] && SPECS_FLAG="--specs $SCALE_SPECS"  # default: the ten example specs
FRESH=""
[ "${SCALE_FRESH:-0}" = "1" ] && FRESH="--fresh"
python3 benchmarks/scale_bench.py --out "$OUT_DIR" --configs "${SCALE_CONFIGS:-gpus0,all}" \
  --command "${SCALE_COMMAND:-build}" --timeout "${SCALE_TIMEOUT:-560}" --extra "${SCALE_EXTRA:---tune-budget 30}" \
  $SPECS_FLAG $FRESH 2>&1 | tee "$OUT_DIR/scale.log"
exit ${PIPESTATUS[0]}
