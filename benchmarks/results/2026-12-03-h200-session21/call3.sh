#!/usr/bin/env bash
# Session 21, call 3 (~450 s): the ten committed kernels of specs/ re-verified (`specgen verify --locked`,
# no record) with this session's verifier: the full-size phase's odd twin of its largest case (every
# dim one step off) and second pre-fills that differ from the first everywhere. Three streams.
set -uo pipefail
started=$(date +%s)
T=${STREAM_S:-430}
for folder in .whl; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl 2>/dev/null
done
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
i=0
for group in "cross_entropy softmax gelu_tanh rope" "rmsnorm add_rmsnorm swiglu" "log_softmax layernorm_gelu bias_gelu linear_bias_relu"; do
  i=$((i+1)); files=(); for s in $group; do files+=("specs/$s.yaml"); done
  timeout $T python3 -m specgen verify --locked "${files[@]}" --json "$OUT/logs/committed-$i.json" > "$OUT/logs/committed-$i.log" 2>&1 &
done
wait
echo "[$(( $(date +%s) - started )) s] streams done" >> "$OUT/summary.txt"
for i in 1 2 3; do echo "== stream $i (exit in log)" >> "$OUT/summary.txt"; grep -iE "passed|rejected|fail|verdict|error|odd|unwritten" "$OUT/logs/committed-$i.log" | grep -v "^\s*$" | tail -14 | cut -c1-200 >> "$OUT/summary.txt"; done
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call.tgz"
cut -c1-220 "$OUT/summary.txt"
