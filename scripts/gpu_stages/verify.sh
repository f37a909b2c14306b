# Stage `verify`: the verifier on the GPU. First, alone on the GPU: one verification on a fresh
# worker, one on the warm worker, then 4 side by side (verify_suite.py --timing). Then, side by
# side (their full-size cases and timed calls take turns through the GPU lock): the good kernels,
# the project's adversarial kernels, the committed kernels re-verified into the lock
# (`specgen verify --locked --record`: the updated lock is copied to $STAGE_OUT), the held-out
# attack suites (VERIFY_HELDOUT="v2 v3", v1 with VERIFY_HELDOUT_V1=1). Everything stops at VERIFY_SUITE_S seconds (default 540); the JSON files list
# what ran. Runs under scripts/gpu-suite: $STAGE_OUT is its result folder.
# VERIFY_PARTS picks the parts (default: all of "timing adversarial committed heldout"; the good
# kernels run with timing); VERIFY_HELDOUT_ONLY: held-out file names (substrings), to finish a
# suite that an earlier call did not reach; VERIFY_ONLY_<suite> (e.g. VERIFY_ONLY_v3): the same for one
# suite only; with '|' in a filter, each '|'-separated group runs as a stream of its own. VERIFY_COMMITTED: the spec files or folders re-verified from the lock (default specs).
# VERIFY_ADVERSARIAL_ONLY: adversarial file names (substrings) to run; VERIFY_HELDOUT_ARGS: extra
# heldout/run_attacks_v2.py flags (e.g. --no-bench: verify only, leaving the GPU to verdicts).
set -uo pipefail
PARTS=" ${VERIFY_PARTS:-timing adversarial committed heldout} "
has() { [[ "$PARTS" == *" $1 "* ]]; }
S="${VERIFY_SUITE_S:-540}"
end=$(( $(date +%s) + S ))
left() { echo $(( end - $(date +%s) > 5 ? end - $(date +%s) : 5 )); }
suite() { timeout "$(left)" python3 scripts/gpu_stages/verify_suite.py "$@"; }
done_file="$STAGE_OUT/timing.done"
pids=()
if has timing; then
  SPECGEN_WORKER_PROFILE="${VERIFY_PROFILE_DIR:-}" suite --json "$STAGE_OUT/main.json" --groups good --timing --timing-done "$done_file" > "$STAGE_OUT/main.log" 2>&1 &
  pids=($!)
  while [ ! -f "$done_file" ] && kill -0 "${pids[0]}" 2>/dev/null; do sleep 2; done
fi
if has adversarial; then
  # shellcheck disable=SC2086
  suite --json "$STAGE_OUT/adversarial.json" --groups adversarial --bench ${VERIFY_ADVERSARIAL_ONLY:+--only $VERIFY_ADVERSARIAL_ONLY} \
    > "$STAGE_OUT/adversarial.log" 2>&1 &
  pids+=($!)
fi
# the committed kernels: --record only when VERIFY_RECORD=1 (it also times each one: minutes).
# With '|' in VERIFY_COMMITTED, each '|'-separated group of specs is a process of its own
# (committed-N.json/.log), so nine specs of ~100 s each fit in one call.
if has committed; then
  cp specs/specgen.lock "$STAGE_OUT/specgen.lock.before"
  IFS='|' read -r -a committed_groups <<< "${VERIFY_COMMITTED:-specs}"
  n=0
  for group in "${committed_groups[@]}"; do
    [ -n "${group// /}" ] || continue
    tag=""; [ ${#committed_groups[@]} -gt 1 ] && tag="-$n"; n=$(( n + 1 ))
    ( record=""; [ "${VERIFY_RECORD:-0}" = 1 ] && record="--record"
    # shellcheck disable=SC2086
    timeout "$(left)" python3 -m specgen verify --locked $record $group --json "$STAGE_OUT/committed$tag.json" \
      > "$STAGE_OUT/committed$tag.log" 2>&1
    echo "exit $?" >> "$STAGE_OUT/committed$tag.log" ) &
    pids+=($!)
  done
fi
# held-out attacks: the suites named in VERIFY_HELDOUT (default v3, the newest: v2 was run in
# session 5 and the verifier changed after it), each in two streams (or one per '|' group of its
# filter), each kernel in its own process
has heldout && for suite in ${VERIFY_HELDOUT:-v3}; do
  [ -d "heldout/attacks-$suite" ] || continue
  only_var="VERIFY_ONLY_${suite//-/_}"  # a per-suite filter (VERIFY_ONLY_v3=...) before the common one
  filter="${!only_var:-${VERIFY_HELDOUT_ONLY:-}}"
  # shellcheck disable=SC2206
  only=($filter)
  if [[ "$filter" == *"|"* ]]; then  # groups separated by '|': one stream each
    IFS='|' read -r -a parts <<< "$filter"
  elif [ ${#only[@]} -gt 0 ]; then
    parts=("${only[*]:0:$(( (${#only[@]} + 1) / 2 ))}" "${only[*]:$(( (${#only[@]} + 1) / 2 ))}")
  else
    parts=("gelu_tanh swiglu rmsnorm" "softmax cross_entropy bias_gelu")
  fi
  for part in "${parts[@]}"; do
    [ -n "$part" ] || continue
    tag=${part%% *}; tag=${tag%.cu}
    # shellcheck disable=SC2086
    timeout "$(left)" python3 heldout/run_attacks_v2.py "heldout/attacks-$suite" --only $part ${VERIFY_HELDOUT_ARGS:-} \
      --out "$STAGE_OUT/heldout-$suite-$tag.json" > "$STAGE_OUT/heldout-$suite-$tag.log" 2>&1 &
    pids+=($!)
  done
done
if [ -d heldout/attacks ] && [ "${VERIFY_HELDOUT_V1:-0}" = 1 ]; then  # the first suite: measured in run 2
  timeout "$(left)" python3 heldout/run_heldout.py --json "$STAGE_OUT/heldout-v1.json" \
    > "$STAGE_OUT/heldout-v1.log" 2>&1 &
  pids+=($!)
fi
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for f in main adversarial; do [ -f "$STAGE_OUT/$f.log" ] && sed -n '/== summary/,$p' "$STAGE_OUT/$f.log"; done
for f in "$STAGE_OUT"/committed*.log; do [ -f "$f" ] && { echo "== $f"; tail -3 "$f"; }; done
[ -f "$STAGE_OUT/specgen.lock.before" ] && cp specs/specgen.lock "$STAGE_OUT/specgen.lock"
for f in "$STAGE_OUT"/heldout-*.log; do [ -f "$f" ] && { echo "== $f"; tail -3 "$f"; }; done
grep -h " NO " "$STAGE_OUT"/*.log | cut -c1-150
exit $status
