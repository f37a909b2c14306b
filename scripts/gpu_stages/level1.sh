# Stage `level1`: the level-1 suite (benchmarks/level1_bench.py): the built-in generator as a user
# meets it (lower, generate + verify, nothing written), every benchmark row timed beside eager and
# torch.compile, against the targets of issue #12: first the development suite
# (benchmarks/level1/specs), then the held-out problems (heldout/problems), in one GPU call.
# Results: $STAGE_OUT/dev/level1_bench.{json,md}, $STAGE_OUT/heldout/level1_bench.{json,md},
# the logs, and level1-logs.tar.gz (everything above in one file).
# The held-out rows stay in the files: the log shows only their per-family and target summary.
# Knobs: LEVEL1_BUDGET_S (total seconds for both sets, default 510: with the backstops, under 10 minutes), LEVEL1_HELDOUT_S (seconds kept for the
#   held-out set, default 150), LEVEL1_SETS (dev | heldout | both, default both), LEVEL1_SIZES
#   (decode | large | all, default all), LEVEL1_ONLY (spec names, comma-separated), LEVEL1_SHARD (K/N:
#   every N-th spec from the K-th, to split the suite over several calls; merge with --merge),
#   LEVEL1_SKIP_REACHED (JSON files of earlier calls, space-separated: their reached problems left out),
#   LEVEL1_SPEC_BUDGET_S (timing per spec, default 150), LEVEL1_TUNE_BUDGET_S (the tuner's seconds per
#   spec, default specgen generate's), LEVEL1_ARGS (more benchmarks/level1_bench.py flags),
#   LEVEL1_HELDOUT_DIR (the held-out folder, default heldout/problems; heldout/problems-v2 and
#   heldout/problems-v3 are the second and third sets).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"
OUT_DIR="${STAGE_OUT:-${OUT:-/tmp/level1-out}/level1}"
mkdir -p "$OUT_DIR"
BUDGET="${LEVEL1_BUDGET_S:-510}"
HELDOUT_S="${LEVEL1_HELDOUT_S:-150}"
SETS="${LEVEL1_SETS:-both}"
started=$(date +%s)
export GIT_COMMIT="${GIT_COMMIT:-$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)}"
common=(--sizes "${LEVEL1_SIZES:-all}" --spec-budget-s "${LEVEL1_SPEC_BUDGET_S:-150}")
[ -n "${LEVEL1_ONLY:-}" ] && common+=(--only "$LEVEL1_ONLY")
# the tuner's seconds per problem (default: `specgen generate`'s, 240 s, which the timing budget
# does not bound: session 29 reached one problem in 900 s without it)
[ -n "${LEVEL1_TUNE_BUDGET_S:-}" ] && common+=(--tune-budget "$LEVEL1_TUNE_BUDGET_S")
[ -n "${LEVEL1_SHARD:-}" ] && common+=(--shard "$LEVEL1_SHARD")
# shellcheck disable=SC2206
[ -n "${LEVEL1_SKIP_REACHED:-}" ] && common+=(--skip-reached ${LEVEL1_SKIP_REACHED})
# shellcheck disable=SC2206
extra=(${LEVEL1_ARGS:-})
status=0

run_set() {  # run_set NAME SPECS_DIR BUDGET_S [flags...]
  local name=$1 specs=$2 budget=$3; shift 3
  mkdir -p "$OUT_DIR/$name"
  echo "== level1 $name: $specs, budget ${budget} s"
  # the script stops starting specs at its budget and writes its JSON after every spec;
  # the timeout is the backstop for a single spec that hangs
  timeout --kill-after=20 $(( budget + 45 )) python3 benchmarks/level1_bench.py --specs "$specs" \
    --out "$OUT_DIR/$name" --budget-s "$budget" "${common[@]}" ${extra[@]+"${extra[@]}"} "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && { echo "level1 $name: exit $rc"; status=1; }
  return 0
}

if [ "$SETS" = "dev" ] || [ "$SETS" = "both" ]; then
  dev_budget=$BUDGET
  if [ "$SETS" = "both" ]; then  # the held-out set keeps LEVEL1_HELDOUT_S, at most 30% of the budget
    [ "$HELDOUT_S" -gt $(( BUDGET * 3 / 10 )) ] && HELDOUT_S=$(( BUDGET * 3 / 10 ))
    dev_budget=$(( BUDGET - HELDOUT_S ))
  fi
  [ "$dev_budget" -lt 30 ] && dev_budget=30
  run_set dev benchmarks/level1/specs "$dev_budget"
  tail -n 80 "$OUT_DIR/dev.log"
fi
if [ "$SETS" = "heldout" ] || [ "$SETS" = "both" ]; then
  left=$(( BUDGET - ( $(date +%s) - started ) - 15 ))
  [ $left -lt 30 ] && left=30
  # held out: rows only in the files, the summary in the log
  run_set heldout "${LEVEL1_HELDOUT_DIR:-heldout/problems}" "$left" --summary-only
  grep -v "^\[level1\] spec " "$OUT_DIR/heldout.log" | tail -n 40
fi
tar czf "$OUT_DIR/level1-logs.tar.gz" -C "$OUT_DIR" --exclude level1-logs.tar.gz . 2>/dev/null
echo "== level1: $(( $(date +%s) - started )) s; results under $OUT_DIR (dev/, heldout/, level1-logs.tar.gz)"
exit $status
