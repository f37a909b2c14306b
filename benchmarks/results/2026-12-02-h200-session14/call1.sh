#!/usr/bin/env bash
# Session 14, call 1 (from the repository root on the GPU machine; ~560 s).
#   1. benchmarks/precision_ab.py: default, `chains` and `kahan` (compensated partials) on float32
#      norms at `huge` inputs, with times at a wide looped shape and the benchmark shape;
#   2. held-out level 1 `layernorm_2d_affine` through the user's path (the tuner now tries the
#      variants set aside for speed, `kahan` among them, when none of the others verifies);
#   3. decode softmax/log_softmax: committed, fewblock, few:fewblock+medium:twopass (decode_ab.py);
#   4. held-out level 1 `logsigmoid` (not reached in session 13);
#   5. ncu (clocks not locked) on decode_profile.py's kernels: ours (fewblock) against Liger's.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-560} - ($(date +%s) - started) )); }
REPO="$PWD"; export PATH="$PATH:/usr/local/cuda/bin"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"

timeout 200 python3 benchmarks/precision_ab.py --out "$OUT" --sources default,chains,kahan > "$OUT/logs/precision_ab.log" 2>&1
log "precision_ab: exit $?"; grep -v "^\[\|Warning\|warn" "$OUT/logs/precision_ab.log" | tail -16 | cut -c1-250 >> "$OUT/summary.txt"

level1() {  # level1 NAME SECONDS
  local t=$2
  LEVEL1_SETS=heldout LEVEL1_ONLY=$1 LEVEL1_BUDGET_S=$(( t - 20 )) LEVEL1_HELDOUT_S=$(( t - 20 )) \
    LEVEL1_SPEC_BUDGET_S=$(( t - 25 )) timeout $t scripts/gpu-suite level1 > "$OUT/logs/level1_$1.log" 2>&1
  log "level1 heldout $1: exit $?"
  mkdir -p "$OUT/level1_$1" && cp -r "$OUT"/level1/heldout/* "$OUT/level1_$1/" 2>/dev/null
  grep -E "^\| [a-z]" "$OUT"/level1/heldout/level1_bench.md 2>/dev/null | cut -c1-240 | head -30 >> "$OUT/summary.txt"
  rm -rf "$OUT/level1"
}
level1 layernorm_2d_affine 120

timeout 100 python3 benchmarks/decode_ab.py --out "$OUT/decode" --ops softmax,log_softmax \
  --sources committed,fewblock,few:fewblock+medium:twopass --rows 1,8,32 > "$OUT/logs/decode_ab.log" 2>&1
log "decode_ab: exit $?"
grep -E "^[a-z_]+ +(forward|backward)" "$OUT/logs/decode_ab.log" | sed 's/  */ /g' | cut -c1-200 >> "$OUT/summary.txt"

t=$(( $(left) - 110 ))
[ $t -gt 90 ] && level1 logsigmoid $(( t > 150 ? 150 : t ))

t=$(( $(left) - 15 ))
if [ $t -gt 40 ] && command -v ncu > /dev/null; then
  timeout $t ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section LaunchStats \
    --csv --page details -c 400 \
    python3 benchmarks/decode_profile.py --plain --out "$OUT/profile" --op softmax --rows 8 --dtypes bfloat16 \
    --sources fewblock,few:fewblock+medium:twopass > "$OUT/logs/ncu.csv" 2> "$OUT/logs/ncu.err"
  log "ncu: exit $?"
  python3 - "$OUT/logs/ncu.csv" >> "$OUT/summary.txt" <<'PY'
import csv, sys
keep = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "Warp Cycles Per Issued Instruction",
        "Stall Barrier", "Registers Per Thread", "Grid Size", "Block Size")
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.DictReader(lines))
seen = {}
for r in rows:
    if r.get("Metric Name") in keep:
        seen.setdefault((r["ID"], r["Kernel Name"][:60]), {})[r["Metric Name"]] = r["Metric Value"]
big = [(k, m) for k, m in seen.items() if any(w in k[1] for w in ("softmax", "sg", "kernel_", "void"))]
for (i, name), m in big[-16:]:
    print("ncu", i, name, "|", "; ".join(f"{k}={v}" for k, v in m.items()))
PY
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cut -c1-250 "$OUT/summary.txt"
