#!/usr/bin/env bash
# one-off: where does the out-of-range call die?
set -u
R=$OUT; export OUT=/tmp/gout3; mkdir -p $OUT
export HOST_OVERHEAD_BENCH=0 GENERATED_TESTS_ARGS="-q --deselect=x"
timeout 200 scripts/gpu-suite host_overhead > $OUT/stage.log 2>&1
tail -12 $OUT/stage.log
SITE=$(ls -d /tmp/specgen-host-overhead.*/site | head -1)
export PYTHONPATH="$SITE:/tmp/site:${PYTHONPATH:-}"
cd /tmp
for name in add_rmsnorm rmsnorm softmax gelu_tanh; do
  for check in check_outside_range_warns_once check_unsupported_gpu_is_a_clear_error; do
    echo "== $check $name"
    timeout 60 python3 -X faulthandler -c "import sys, pytest
from specgen_kernels.tests import test_ops as t
t.$check(sys.argv[1]); print('OK')" $name 2>&1 | tail -25
    echo "rc ${PIPESTATUS[0]}"
  done
done > $OUT/faulthandler.log 2>&1
cat $OUT/faulthandler.log | cut -c1-200 | tail -120
if command -v gdb >/dev/null; then
  timeout 90 gdb -batch -ex run -ex bt --args python3 -c "from specgen_kernels.tests import test_ops as t
t.check_outside_range_warns_once('add_rmsnorm')" > $OUT/gdb.log 2>&1
  grep -A40 "SIGSEGV" $OUT/gdb.log | cut -c1-220 | head -60
else echo "no gdb"; fi
tar czf $R/call4-crash.tgz -C $OUT .
