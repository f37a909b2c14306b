# Sourced by stages that run named steps (package, host_overhead): `step NAME TIMEOUT COMMAND...`
# runs the command under a time limit, logs it to $OUT_DIR/NAME.log, prints its tail, and keeps
# its result (PASS / FAIL (exit N)) and seconds in RESULT[NAME] and SECONDS_OF[NAME].
declare -A RESULT SECONDS_OF

step() {
  local name=$1 limit=$2; shift 2
  local started=$(date +%s)
  timeout "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  SECONDS_OF[$name]=$(( $(date +%s) - started ))
  RESULT[$name]=$([ $rc -eq 0 ] && echo PASS || echo "FAIL (exit $rc)")
  tail -25 "$OUT_DIR/$name.log"
  return $rc
}
