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
python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider ${GPUTESTS_K:+-k "$GPUTESTS_K"} "${files[@]}" \
  2>/dev/null | grep "::" > "$OUT_DIR/ids.all"
first="${GPUTESTS_FIRST:-}"
if [ -n "$first" ]; then
  { grep -E "$first" "$OUT_DIR/ids.all"; grep -vE "$first" "$OUT_DIR/ids.all"; } > "$OUT_DIR/ids"
else
  cp "$OUT_DIR/ids.all" "$OUT_DIR/ids"
fi
n=${GPUTESTS_SHARDS:-4}
echo "gputests: $(wc -l < "$OUT_DIR/ids") tests in $n processes, ${GPUTESTS_S:-200} s each at most"
for k in $(seq 0 $((n - 1))); do
  awk -v n="$n" -v k="$k" 'NR % n == k' "$OUT_DIR/ids" > "$OUT_DIR/ids.$k"
  [ -s "$OUT_DIR/ids.$k" ] || continue
  # shellcheck disable=SC2046
  timeout -s INT -k 20 "${GPUTESTS_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider --assert=plain \
    --tb=short $(cat "$OUT_DIR/ids.$k") > "$OUT_DIR/gpu-tests-$k.log" 2>&1 &
done
wait
status=0
for k in $(seq 0 $((n - 1))); do
  [ -s "$OUT_DIR/ids.$k" ] || continue
  echo "gputests: process $k ($(wc -l < "$OUT_DIR/ids.$k") tests): $(tail -1 "$OUT_DIR/gpu-tests-$k.log")"
  grep -E "^(FAILED|ERROR|E  )" "$OUT_DIR/gpu-tests-$k.log" | cut -c1-300 | head -30
  grep -qE "^(FAILED|ERROR)" "$OUT_DIR/gpu-tests-$k.log" && status=1
done
exit $status
