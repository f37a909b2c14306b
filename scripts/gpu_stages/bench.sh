# Stage `bench`: `specgen bench` on gelu_tanh with the good hand-written kernel: eager,
# torch.compile and the kernel side by side on the spec's benchmark shapes.
set -uo pipefail
timeout 500 python3 -m specgen.cli bench specs/gelu_tanh.yaml --kernel tests/kernels/gelu_tanh.cu \
  --dtype bfloat16 --dtype float32 --json "$STAGE_OUT/bench-gelu_tanh.json" 2>&1 | tee "$STAGE_OUT/bench.log"
exit ${PIPESTATUS[0]}
