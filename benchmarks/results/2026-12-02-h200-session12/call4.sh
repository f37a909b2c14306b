#!/usr/bin/env bash
# Session 12, call 4 (the device time left): decode A/B of the block form of few rows (variant
# `fewblock`: a whole block per row, 2 chunks a thread) against the committed kernels (clusters
# of 8 blocks at these sizes), softmax and log_softmax, 1/8/32 rows of 4096, bf16 and float32.
set -uo pipefail
started=$(date +%s)
REPO="$PWD"
compgen -G ".whl/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs" "$OUT/ab"
timeout ${AB_S:-230} python3 benchmarks/decode_ab.py --out "$OUT/ab" --ops softmax,log_softmax --sources committed,fewblock \
  --rows 1,8,32 > "$OUT/logs/decode_ab.log" 2>&1
echo "[$(( $(date +%s) - started )) s] decode_ab: exit $?" >> "$OUT/summary.txt"
tail -30 "$OUT/logs/decode_ab.log" | cut -c1-200 >> "$OUT/summary.txt"
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call4.tgz"
cat "$OUT/summary.txt"
