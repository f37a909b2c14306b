#!/usr/bin/env bash
# Session 15, call 4 (~200 s of command: the device time left). Call 3's model_patch had the
# specgen-patched model's decode step at 3.07 ms against eager's 2.34 and Liger-RMSNorm's 2.54
# (session 8: 3.02 against eager 3.40): where does the time go? The wheel (`--locked`), then
# model_patch.py --profile-decode (the host ops by self CPU time and the device kernels of 10 steps).
set -uo pipefail
started=$(date +%s)
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
work=$(mktemp -d /tmp/s15d.XXXX)
timeout 100 python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
log "build --locked: exit $?"
wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
  PYTHONPATH="$work/site:$PYTHONPATH" timeout 90 python3 benchmarks/model_patch.py --package specgen_kernels \
    --out "$OUT/model_patch.json" --iters 10 --profile-decode "$OUT/decode_profile.txt" > "$OUT/logs/model_patch.log" 2>&1
  log "model_patch --profile-decode: exit $?"
  grep -A6 "^variant" "$OUT/logs/model_patch.log" >> "$OUT/summary.txt"
  grep -A14 "==== specgen: 10 decode steps, host" "$OUT/decode_profile.txt" | cut -c1-200 >> "$OUT/summary.txt"
fi
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call4.tgz"
cut -c1-220 "$OUT/summary.txt"
