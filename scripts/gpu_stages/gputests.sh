# Stage `gputests`: the GPU-marked tests (pytest -m gpu) of chosen files, in several pytest
# processes side by side (a verification's time is mostly nvcc on the CPUs), the tests that
# match GPUTESTS_FIRST first in each process, each process stopped at GPUTESTS_S seconds with
# SIGINT (pytest then still prints the failures so far). Logs: $STAGE_OUT/gpu-tests-K.log; the
# last lines printed are each process's result and its failures.
# Knobs: GPUTESTS_FILES (default tests/test_builtin_scan.py tests/test_axis_reduce.py),
#   GPUTESTS_FIRST (an extended regex over test ids, default none), GPUTESTS_SHARDS (default 4),
#   GPUTESTS_S (default 200), GPUTESTS_K (a pytest -k expression selecting the tests, default all).
set -uo pipefail
OUT_DIR="${STAGE_OUT:-$OUT/gputests}"
mkdir -p "$OUT_DIR"
# shellcheck disable=SC2206
files=(${GPUTESTS_FILES:-tests/test_builtin_scan.py tests/test_axis_reduce.py})
# a file that fails to import must fail the stage, not drop out of the list
python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider ${GPUTESTS_K:+-k "$GPUTESTS_K"} "${files[@]}" \
  > "$OUT_DIR/collect.log" 2>&1
collected=$?
grep "::" "$OUT_DIR/collect.log" > "$OUT_DIR/ids.all"
status=0
if [ "$collected" -ne 0 ] && [ "$collected" -ne 5 ]; then
  echo "gputests: collection failed (pytest exit $collected):"; grep -E "ERROR|Error" "$OUT_DIR/collect.log" | head -20
  status=1
fi
first="${GPUTESTS_FIRST:-}"
if [ -n "$first" ]; then
  { grep -E "$first" "$OUT_DIR/ids.all"; grep -vE "$first" "$OUT_DIR/ids.all"; } > "$OUT_DIR/ids"
else
  cp "$OUT_DIR/ids.all" "$OUT_DIR/ids"
fi
n=${GPUTESTS_SHARDS:-4}
echo "gputests: $(wc -l < "$OUT_DIR/ids") tests in $n processes, ${GPUTESTS_S:-200} s each at most"
pids=()
for k in $(seq 0 $((n - 1))); do
  awk -v n="$n" -v k="$k" 'NR % n == k' "$OUT_DIR/ids" > "$OUT_DIR/ids.$k"
  [ -s "$OUT_DIR/ids.$k" ] || continue
  mapfile -t ids < "$OUT_DIR/ids.$k"  # one argument a test id (ids may hold spaces)
  timeout -s INT -k 20 "${GPUTESTS_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider --assert=plain \
    --tb=short "${ids[@]}" > "$OUT_DIR/gpu-tests-$k.log" 2>&1 &
  pids[k]=$!
done
for k in "${!pids[@]}"; do
  wait "${pids[k]}"
  rc=$?
  # pytest 0: all passed; anything else (failures, a timeout's 124, a crash, a kill) fails the stage
  echo "gputests: process $k ($(wc -l < "$OUT_DIR/ids.$k") tests, exit $rc): $(tail -1 "$OUT_DIR/gpu-tests-$k.log")"
  grep -E "^(FAILED|ERROR|E  )" "$OUT_DIR/gpu-tests-$k.log" | cut -c1-300 | head -30
  [ "$rc" -ne 0 ] && status=1
done
exit $status
