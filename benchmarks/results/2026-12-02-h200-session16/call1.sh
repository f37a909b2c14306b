#!/usr/bin/env bash
# Session 16, call 1 (experiments, ~480 s of command; nothing is locked):
#   1. softmax at [16384 x 4096] and [4096 x 8192] (profiler device time, decode_ab.py): the
#      committed kernel against the medium rows at fewer chunks per thread, where `data_regs`
#      alone sets the chunks and the register cap (Liger's shape: 256 threads x 16 bf16);
#   2. the few-row forms (block / block + two rounds) for the other row ops at 1 and 8 rows;
#   3. flat_study.py hardsigmoid at 4096 x 393216 (6.4 GB float32) beside x.neg();
#   4. Liger's Triton kernels at 8 x 4096 and 16384 x 4096 compiled into $OUT's Triton cache
#      (their cubins, to read the SASS beside ours on the CPU machine).
set -uo pipefail
started=$(date +%s)
REPO="$PWD"
for folder in .whl .whl-model; do
  compgen -G "$folder/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $folder/*.whl
done
export PYTHONPATH="/tmp/site:$REPO:$REPO/tests:${PYTHONPATH:-}" SPECGEN_CACHE_DIR=/tmp/specgen-cache
mkdir -p "$OUT/logs"
log() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt"
git rev-parse HEAD >> "$OUT/summary.txt"; git status --short | head -5 >> "$OUT/summary.txt"
R="few:fewtwo+medium:cl256+split:default+wide:cl256"   # softmax's recorded variant
SRC="committed,$R~data_regs=16~items_cap=4,$R~data_regs=8~items_cap=2,$R~data_regs=16~items_cap=4~min_threads=1536,$R~data_regs=8~items_cap=2~block_max=1024"
for shape in "16384 4096" "4096 8192"; do
  set -- $shape
  timeout 150 python3 benchmarks/decode_ab.py --out "$OUT/softmax_$1x$2" --ops softmax --rows "$1" --hidden "$2" \
    --sources "$SRC" --dtypes bfloat16,float32 > "$OUT/logs/softmax_$1x$2.log" 2>&1
  log "softmax $1x$2: exit $?"
  sed -e "s/$R/R/g" "$OUT/logs/softmax_$1x$2.log" | grep -E "^softmax" | cut -c1-330 >> "$OUT/summary.txt"
done
timeout 170 python3 benchmarks/decode_ab.py --out "$OUT/few" --ops rmsnorm,add_rmsnorm,cross_entropy,log_softmax,swiglu \
  --rows 1,8 --sources committed,fewblock,fewtwo --dtypes bfloat16,float32 > "$OUT/logs/few.log" 2>&1
log "few forms: exit $?"
grep -E "^[a-z_]+ +(forward|backward)" "$OUT/logs/few.log" | cut -c1-250 >> "$OUT/summary.txt"
timeout 100 python3 benchmarks/flat_study.py benchmarks/level1/specs/hardsigmoid.yaml --harness "" \
  --out "$OUT/flat_hardsigmoid.json" > "$OUT/logs/flat.log" 2>&1
log "flat_study hardsigmoid: exit $?"
grep -E "^u[0-9]" "$OUT/logs/flat.log" | cut -c1-200 >> "$OUT/summary.txt"
mkdir -p "$OUT/triton"
TRITON_CACHE_DIR="$OUT/triton" timeout 90 python3 - > "$OUT/logs/liger_cubins.log" 2>&1 <<'PY'
import torch
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
from liger_kernel.ops.softmax import LigerSoftmaxFunction
from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
for rows, hidden in ((8, 4096), (16384, 4096)):
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(hidden, device="cuda", dtype=dtype, requires_grad=True)
        LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False).sum().backward()
        LigerSoftmaxFunction.apply(x).sum().backward()
        t = torch.randint(0, hidden, (rows,), device="cuda")
        LigerCrossEntropyFunction.apply(x, t, None)[0].backward()
torch.cuda.synchronize()
print("ok")
PY
log "liger cubins: exit $? ($(find "$OUT/triton" -name '*.cubin' | wc -l) cubins)"
cd "$OUT" && tar czf /tmp/call.tgz --exclude summary.txt . && find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/call.tgz "$OUT/call1.tgz"
cut -c1-330 "$OUT/summary.txt"
