#!/usr/bin/env bash
# Session 15, call 1 (from the repository root on the GPU machine; ~585 s of command).
#   softmax, log_softmax, rmsnorm and add_rmsnorm regenerated at session 14's chosen variant each
#   (their specs now take `x: Tensor[*N, D]`, the ABI field stays N, and a decode row {N: 8, D: 4096}):
#   benchmarks/builtin_bench.py --write-lock (generate, verify, time beside eager and torch.compile, lock).
#   gelu_tanh and swiglu also take `*N` now; their locks stay fresh (the spec hash covers the signature
#   as the kernel sees it, batch groups folded), so they are not regenerated.
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-585} - ($(date +%s) - started) )); }
REPO="$PWD"
compgen -G ".whl/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git rev-parse HEAD >> "$OUT/summary.txt"; git status --short | head -12 >> "$OUT/summary.txt"
VARIANTS="softmax=medium:cl256+split:default+wide:cl256+few:fewtwo;log_softmax=fewtwo;rmsnorm=csmem;add_rmsnorm=default"
for op in softmax log_softmax rmsnorm add_rmsnorm; do
  t=$(( $(left) - 12 )); [ $t -gt 200 ] && t=200
  [ $t -lt 90 ] && { log "$op: not reached"; continue; }
  timeout $t python3 benchmarks/builtin_bench.py --out "$OUT/builtin/$op" --dtypes bfloat16,float32 --write-lock \
    --ops $op --variants "$VARIANTS" > "$OUT/logs/builtin_$op.log" 2>&1
  log "builtin $op (regenerate, verify, time, lock): exit $?"
  grep -E "done in|FAILED|Error" "$OUT/logs/builtin_$op.log" | cut -c1-200 | head -4 >> "$OUT/summary.txt"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['ops'][sys.argv[2]]; print(sys.argv[2], d.get('variant'), [n[:160] for n in d.get('notes', [])])" \
    "$OUT/builtin/$op/builtin_bench.json" $op >> "$OUT/summary.txt" 2>&1
done
git status --short specs >> "$OUT/summary.txt"
tar czf "$OUT/specs_after.tgz" specs/kernels specs/specgen.lock
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt --exclude specs_after.tgz . && find "$OUT" -mindepth 1 ! -name summary.txt ! -name specs_after.tgz -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cut -c1-250 "$OUT/summary.txt"
