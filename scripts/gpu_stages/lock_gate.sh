# Stage `lock_gate`: the sanitizer gate before a lock, through the user's command. `specgen generate`
# with the replay agent (a one-attempt transcript) on a copy of specs/softmax.yaml, twice:
#   1. the held-out race (heldout/attacks-v4/softmax_smem_race_missing_sync.cu: passes the verifier,
#      racecheck sees it): expected "not locked", exit 1, no kernel written;
#   2. the held-out control (softmax_control.cu): expected locked, the record sanitized with seconds.
# Results: $STAGE_OUT/<case>.log and lock_gate.json (exit codes, what was locked). Knob: LOCK_GATE_CASES
# (the held-out kernel names to run, default both).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${STAGE_OUT:-${OUT:-/tmp/lock-gate-out}/lock_gate}"
mkdir -p "$OUT_DIR"
cd "$REPO"
export PYTHONPATH="$REPO:${PYTHONPATH:-}"
status=0
for case in ${LOCK_GATE_CASES:-softmax_smem_race_missing_sync softmax_control}; do
  work="$(mktemp -d /tmp/specgen-lock-gate.XXXXXX)"
  cp specs/softmax.yaml "$work/"
  python3 - "$work/transcript.jsonl" "heldout/attacks-v4/$case.cu" <<'PY'
import json, sys
source = open(sys.argv[2]).read()
with open(sys.argv[1], "w") as out:
    out.write(json.dumps({"type": "start", "spec": "softmax", "model": "held-out"}) + "\n")
    out.write(json.dumps({"type": "attempt", "number": 1, "agent": "replay", "source": source}) + "\n")
PY
  started=$(date +%s)
  timeout 280 python3 -m specgen generate "$work/softmax.yaml" --agent replay --transcript "$work/transcript.jsonl" \
    --attempts 1 --transcript-dir "$work/transcripts" > "$OUT_DIR/$case.log" 2>&1
  rc=$?
  python3 - "$work" "$case" "$rc" "$(( $(date +%s) - started ))" "$OUT_DIR/lock_gate.json" <<'PY'
import json, sys
from pathlib import Path
work, case, rc, seconds, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
lock = work / "specgen.lock"
entry = json.loads(lock.read_text())["ops"].get("softmax") if lock.exists() else None
records = (entry or {}).get("records") or [{}]
verification = records[0].get("verification") or {}
rows = json.loads(out.read_text()) if out.exists() else []
rows.append({"case": case, "exit": rc, "seconds": seconds, "kernel_written": (work / "kernels" / "softmax.cu").exists(),
             "locked": entry is not None, "sanitized": verification.get("sanitized"),
             "sanitize_s": verification.get("sanitize_s")})
out.write_text(json.dumps(rows, indent=2) + "\n")
PY
  grep -E "not locked|compute-sanitizer|wrote|verified|attempt 1" "$OUT_DIR/$case.log" | cut -c1-220 | head -8
  expected=$([ "$case" = softmax_control ] && echo 0 || echo 1)
  [ "$rc" = "$expected" ] || { echo "lock_gate: $case exited $rc, expected $expected"; status=1; }
done
echo "== lock_gate"
python3 -c "
import json; rows = json.load(open('$OUT_DIR/lock_gate.json'))
for r in rows: print(f\"{r['case']:34} exit {r['exit']}  locked {r['locked']!s:5} sanitized {r['sanitized']!s:5} {r['sanitize_s']}  {r['seconds']} s\")"
exit $status
