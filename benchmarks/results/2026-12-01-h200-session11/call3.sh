#!/usr/bin/env bash
# Session 11, call 3 (from the repository root on the GPU machine; $OUT set by the device tool).
#   1. regenerate the kernels of record from the generator now, each at the variant its lock entry
#      records (benchmarks/builtin_bench.py --write-lock: verified on this GPU, timed forward and
#      backward beside eager and torch.compile at the benchmark shapes, bf16 and float32, records
#      written to specs/); specs/ comes back in the tarball to commit;
#   2. with the time left: `specgen build specs/ --locked`, and benchmarks/liger_ops.py at decode
#      size (8 x 4096) beside Liger-Kernel, eager and torch.compile (bf16, float32).
set -uo pipefail
started=$(date +%s)
left() { echo $(( ${CALL_S:-585} - ($(date +%s) - started) )); }
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache SPECGEN_TEST_EXAMPLES=10
mkdir -p "$OUT/logs" "$OUT/builtin"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git log --oneline -1 >> "$OUT/summary.txt" 2>/dev/null

timeout 330 python3 benchmarks/builtin_bench.py --out "$OUT/builtin" --dtypes bfloat16,float32 --write-lock \
  --ops gelu_tanh,bias_gelu,swiglu,layernorm_gelu,rmsnorm,add_rmsnorm,softmax,log_softmax,cross_entropy,rope \
  --variants "cross_entropy=cl256;layernorm_gelu=csmem;rmsnorm=csmem;softmax=medium:cl256+split:default+wide:cl256" \
  > "$OUT/logs/builtin.log" 2>&1
log "builtin (regenerate, verify, time, lock): exit $?"
grep -E "done in|FAILED" "$OUT/logs/builtin.log" | cut -c1-200 >> "$OUT/summary.txt"
grep -E "^\| " "$OUT/builtin/builtin_bench.md" 2>/dev/null | cut -c1-170 | head -100 >> "$OUT/summary.txt"
cp -r specs "$OUT/specs"
git status --short specs | head -30 >> "$OUT/summary.txt"

t=$(left)
if [ $t -gt 230 ]; then
  work=$(mktemp -d /tmp/s11.XXXX)
  timeout $(( t - 50 )) python3 -m specgen build specs -o "$work/dist" --name specgen_kernels --locked > "$OUT/logs/build.log" 2>&1
  log "build --locked: exit $?"; tail -2 "$OUT/logs/build.log" | cut -c1-200 >> "$OUT/summary.txt"
  wheel=$(ls "$work"/dist/specgen_kernels-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    python3 -m pip install -q --no-deps --no-index --target "$work/site" "$wheel"
    export PYTHONPATH="$work/site:$PYTHONPATH"
    t=$(( $(left) - 8 ))
    [ $t -gt 30 ] && timeout $t python3 benchmarks/liger_ops.py --package specgen_kernels --dtypes bfloat16,float32 \
      --shapes 8x4096 --out "$OUT/liger_ops.json" > "$OUT/logs/liger_ops.log" 2>&1
    log "liger_ops decode: exit $?"; grep -E "^\S+ +forward" "$OUT/logs/liger_ops.log" | head -24 >> "$OUT/summary.txt"
  fi
fi

cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call3.tgz"
cut -c1-300 "$OUT/summary.txt"
