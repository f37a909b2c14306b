# Stage `host_overhead` (scripts/gpu-suite host_overhead, or standalone: OUT=/tmp/o bash scripts/gpu_stages/host_overhead.sh):
#   1. `specgen build specs --locked` of a copy of specs/ (the committed kernels and lock) into a wheel;
#   2. the wheel installed with pip --no-deps --target + PYTHONPATH;
#   3. its generated tests, GPU ones included (the C++ call path: errors, autograd, torch.compile);
#   4. benchmarks/host_overhead.py: host time per call (forward, forward+backward) of softmax,
#      gelu_tanh, rmsnorm, swiglu, cross_entropy at decode sizes beside the closest eager aten ops
#      (target: <= 1.5x), with --compile;
#   5. the JSON, the table and every log into $STAGE_OUT.
# Knobs: PACKAGE_WHEEL=path.whl (skip step 1: test a wheel built earlier; keeps the stage well under
#   10 minutes when the build is slow), HOST_OVERHEAD_ARGS
#   (extra benchmarks/host_overhead.py flags), SPECGEN_TEST_EXAMPLES (default here 10),
#   HOST_OVERHEAD_BENCH=0 (build and test the wheel only), GENERATED_TESTS_ARGS (default -q).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${STAGE_OUT:-${OUT:-/tmp/host-overhead-out}/host_overhead}"
mkdir -p "$OUT_DIR"
cd "$REPO"
export PYTHONPATH="$REPO:${PYTHONPATH:-}"
export SPECGEN_TEST_EXAMPLES="${SPECGEN_TEST_EXAMPLES:-10}"
PKG=specgen_kernels
WORK="$(mktemp -d /tmp/specgen-host-overhead.XXXXXX)"
# shellcheck source=lib/steps.sh
source "$HERE/lib/steps.sh"

# ---- 1. build (the committed kernels, --locked: nothing is generated)
if [ -n "${PACKAGE_WHEEL:-}" ]; then
  mkdir -p "$WORK/dist" && cp "$PACKAGE_WHEEL" "$WORK/dist/"
  RESULT[build]="skipped (PACKAGE_WHEEL)"; SECONDS_OF[build]=0
else
  cp -r specs "$WORK/specs-copy"
  step build 400 python3 -m specgen.cli build "$WORK/specs-copy" -o "$WORK/dist" --name "$PKG" --locked
  cp "$WORK"/dist/*.build.log "$OUT_DIR/" 2>/dev/null
fi
WHEEL="$(ls "$WORK"/dist/$PKG-*.whl 2>/dev/null | head -1)"

# ---- 2.-4. install, generated tests, benchmark
if [ -n "$WHEEL" ]; then
  cp "$WHEEL" "$OUT_DIR/"
  step install 120 python3 -m pip install -q --no-deps --no-index --target "$WORK/site" "$WHEEL"
  export PYTHONPATH="$WORK/site:$PYTHONPATH"
  cd "$WORK"  # no source tree may shadow the installed package
  # shellcheck disable=SC2086
  step generated_tests 240 python3 -m pytest ${GENERATED_TESTS_ARGS:--q} -p no:cacheprovider -rs \
    --junitxml "$OUT_DIR/generated_tests.xml" --pyargs "$PKG.tests"
  cd "$REPO"
  if [ "${HOST_OVERHEAD_BENCH:-1}" = 1 ]; then
    # shellcheck disable=SC2086
    step benchmark 420 python3 benchmarks/host_overhead.py --package "$PKG" --compile \
      --out "$OUT_DIR/host_overhead.json" ${HOST_OVERHEAD_ARGS:-}
  else
    RESULT[benchmark]="skipped (HOST_OVERHEAD_BENCH=0)"; SECONDS_OF[benchmark]=0
  fi
else
  RESULT[install]="no wheel"
fi

# ---- 5. the short table, last
echo
echo "== host_overhead stage: $(basename "${WHEEL:-no wheel}")"
printf '%-16s %-22s %s\n' step result seconds
status=0
for name in build install generated_tests benchmark; do
  printf '%-16s %-22s %s\n' "$name" "${RESULT[$name]:-not run}" "${SECONDS_OF[$name]:--}"
  case "${RESULT[$name]:-not run}" in PASS|skipped*) ;; *) status=1 ;; esac
done
grep -E "passed|failed|error" "$OUT_DIR/generated_tests.log" 2>/dev/null | tail -1
grep -E "rows meet the target" "$OUT_DIR/benchmark.log" 2>/dev/null | tail -1
exit $status
