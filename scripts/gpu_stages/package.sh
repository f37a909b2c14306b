# Stage `package` (scripts/gpu-suite package, or standalone: OUT=/tmp/o bash scripts/gpu_stages/package.sh):
#   1. `specgen build` of a clean copy of specs/*.yaml (no kernels, no lock): the built-in agent
#      generates, verifies on this GPU, locks, then the wheel is built — timed;
#   2. the wheel installed with pip --target + PYTHONPATH (python3 is itself a venv here);
#   3. its generated tests, GPU ones included;
#   4. scripts/model_check.py: a transformer block through torch.ops.specgen_kernels.*, eager
#      and under torch.compile, against the specs' references;
#   5. the wheel, the new specs/kernels + specgen.lock (to commit) and every log into $STAGE_OUT.
# Knobs: PACKAGE_FROM_LOCK=1 (step 1 builds specs/ as committed, with --locked), PACKAGE_BUILD_ARGS (extra `specgen build` flags, default "--attempts 2"),
#   PACKAGE_WHEEL=path.whl (skip steps 1: test a wheel built earlier), SPECGEN_TEST_EXAMPLES
#   (Hypothesis cases per op in the generated tests, default here 10), PACKAGE_BUILD_TIMEOUT (s).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${STAGE_OUT:-${OUT:-/tmp/package-out}/package}"
mkdir -p "$OUT_DIR"
cd "$REPO"
if [ -z "${STAGE_OUT:-}" ]; then  # standalone: what scripts/gpu-suite's header does
  if compgen -G "$REPO/.whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$REPO"/.whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
  fi
  export PYTHONPATH="$REPO:${PYTHONPATH:-}"
fi
export SPECGEN_TEST_EXAMPLES="${SPECGEN_TEST_EXAMPLES:-10}"
PKG=specgen_kernels
WORK="$(mktemp -d /tmp/specgen-package.XXXXXX)"
# shellcheck source=lib/steps.sh
source "$HERE/lib/steps.sh"

# ---- 1. build from a clean state
if [ -n "${PACKAGE_WHEEL:-}" ]; then
  mkdir -p "$WORK/dist" && cp "$PACKAGE_WHEEL" "$WORK/dist/"
  RESULT[build]="skipped (PACKAGE_WHEEL)"; SECONDS_OF[build]=0
elif [ "${PACKAGE_FROM_LOCK:-0}" = "1" ]; then
  # the committed kernels and lock as they are: `--locked` builds, never generates
  cp -r specs "$WORK/specs"
  # shellcheck disable=SC2086
  step build "${PACKAGE_BUILD_TIMEOUT:-330}" python3 -m specgen.cli build "$WORK/specs" -o "$WORK/dist" --name "$PKG" \
    --locked --keep-tree "$WORK/tree" --hub-layout "$WORK/hub" ${PACKAGE_BUILD_ARGS:-}
  cp "$WORK"/dist/*.build.log "$OUT_DIR/" 2>/dev/null
else
  mkdir -p "$WORK/specs" && cp specs/*.yaml "$WORK/specs/"
  # shellcheck disable=SC2086
  step build "${PACKAGE_BUILD_TIMEOUT:-330}" python3 -m specgen.cli build "$WORK/specs" -o "$WORK/dist" --name "$PKG" \
    --keep-tree "$WORK/tree" --transcript-dir "$OUT_DIR/transcripts" --hub-layout "$WORK/hub" \
    ${PACKAGE_BUILD_ARGS:---attempts 2}
  mkdir -p "$OUT_DIR/specs"
  cp -r "$WORK/specs/kernels" "$OUT_DIR/specs/" 2>/dev/null
  cp "$WORK/specs/specgen.lock" "$OUT_DIR/specs/" 2>/dev/null
  cp "$WORK"/dist/*.build.log "$OUT_DIR/" 2>/dev/null
fi
WHEEL="$(ls "$WORK"/dist/$PKG-*.whl 2>/dev/null | head -1)"

# ---- 2.-4. install, generated tests, model check
if [ -n "$WHEEL" ]; then
  cp "$WHEEL" "$OUT_DIR/"
  step install 120 python3 -m pip install -q --no-deps --no-index --target "$WORK/site" "$WHEEL"
  export PYTHONPATH="$WORK/site:${PYTHONPATH:-}"
  # run from $WORK: no source tree may shadow the installed package
  cd "$WORK"
  step generated_tests "${PACKAGE_TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -rs \
    --junitxml "$OUT_DIR/generated_tests.xml" --pyargs "$PKG.tests"
  cd "$REPO"
  step model_check 120 python3 scripts/model_check.py --package "$PKG" --specs specs --out "$OUT_DIR/model_check.json"
  python3 - "$PKG" > "$OUT_DIR/package_info.txt" 2>&1 <<'EOF'
import sys, importlib, torch
pkg = importlib.import_module(sys.argv[1])
print("torch", torch.__version__, "| kernels loaded:", pkg.CUDA_KERNELS_LOADED, "| error:", pkg.CUDA_KERNELS_ERROR)
print("unverified:", pkg.UNVERIFIED_OPS, "| reference path:", pkg.REFERENCE_OPS)
for op, p in pkg.PROVENANCE.items():
    print(f"  {op:16} {p.get('status'):10} {p.get('agent') or '-':10} {p.get('verified_on') or '-'}  {p.get('note') or ''}")
EOF
else
  RESULT[install]="no wheel"
fi

# ---- 5. the short table, last
echo
echo "== package stage: $(basename "${WHEEL:-no wheel}")"
cat "$OUT_DIR/package_info.txt" 2>/dev/null
printf '%-16s %-22s %s\n' step result seconds
status=0
for name in build install generated_tests model_check; do
  printf '%-16s %-22s %s\n' "$name" "${RESULT[$name]:-not run}" "${SECONDS_OF[$name]:--}"
  case "${RESULT[$name]:-not run}" in PASS|skipped*) ;; *) status=1 ;; esac
done
grep -E "passed|failed|error" "$OUT_DIR/generated_tests.log" 2>/dev/null | tail -1
exit $status
