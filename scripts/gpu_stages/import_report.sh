# Stage `import_report` (issue 15 end to end): a KernelBench-style module file specgen was not
# tuned on (examples/import/residual_silu_model.py, or IMPORT_TARGET) -> `specgen import` ->
# `specgen check` -> `specgen build` (the built-in agent generates, verifies on this GPU, tunes
# for IMPORT_TUNE_S seconds, locks and packages) -> `specgen report` (needs matplotlib: where it
# is missing here, run the report on the returned specs/ and lock). Writes the imported spec,
# its kernel and lock under $STAGE_OUT/specs/, the build's JSON, the report.
# IMPORT_STEPS (default "build report"): `bench` adds `specgen bench` of the built-in agent's
# default kernel for the imported spec (the variant that a build starts from), alone on the GPU,
# beside eager and torch.compile: to see whether a slow build verdict is the kernel or the run.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${STAGE_OUT:-${OUT:-/tmp/import-report-out}/import_report}"
mkdir -p "$OUT_DIR"
cd "$REPO"
TARGET="${IMPORT_TARGET:-examples/import/residual_silu_model.py}"
WORK="$(mktemp -d /tmp/specgen-import.XXXXXX)"
status=0
run() {  # run NAME COMMAND...: its output in $OUT_DIR/NAME.log, a line in the table
  local name=$1; shift
  local started=$(date +%s)
  "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  printf '%-8s exit %-3s %4s s  %s\n' "$name" "$rc" "$(( $(date +%s) - started ))" "$*" | cut -c1-160 >> "$OUT_DIR/steps.txt"
  [ $rc -ne 0 ] && status=1
  return $rc
}
STEPS=" ${IMPORT_STEPS:-build report} "
has() { [[ "$STEPS" == *" $1 "* ]]; }  # as verify.sh: is step $1 asked for
run import python3 -m specgen import "$TARGET" -o "$WORK/specs/" --json "$OUT_DIR/import.json" \
  && run check python3 -m specgen check "$WORK/specs" || exit 1
if has bench; then
  for spec in "$WORK"/specs/*.yaml; do
    name=$(basename "$spec" .yaml)
    python3 -c "import sys; from specgen.spec import load_spec; from specgen.agents.builtin.generator import build_source; sys.stdout.write(build_source(load_spec(sys.argv[1])))" \
      "$spec" > "$OUT_DIR/$name.default.cu" \
      && run "bench-$name" python3 -m specgen bench "$spec" --kernel "$OUT_DIR/$name.default.cu" --json "$OUT_DIR/bench-$name.json"
    tail -12 "$OUT_DIR/bench-$name.log"
  done
fi
has build && run build timeout 400 python3 -m specgen build "$WORK/specs" -o "$WORK/dist" \
  --tune-budget "${IMPORT_TUNE_S:-40}" --json "$OUT_DIR/build.json"
has report && python3 -c "import matplotlib" 2>/dev/null \
  && run report python3 -m specgen report "$WORK/specs" -o "$OUT_DIR/report.html"
mkdir -p "$OUT_DIR/specs" && cp -r "$WORK/specs/." "$OUT_DIR/specs/"
ls "$WORK"/dist/*.whl >> "$OUT_DIR/steps.txt" 2>&1
echo "== import_report"; cat "$OUT_DIR/steps.txt"; tail -15 "$OUT_DIR/build.log" 2>/dev/null
exit $status
