#!/usr/bin/env bash
# session 9, last call: the sanitizer gate (two cases side by side; the wheel building meanwhile),
# then the wheel's generated tests, then dbg/probe.py (decode rows with workspaces; the held-out
# batchnorm1d verdict).
set -u
G=$OUT; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
(OUT=$G/g1 LOCK_GATE_CASES=softmax_smem_race_missing_sync timeout 220 scripts/gpu-suite lock_gate > $G/gate1.log 2>&1) &
sleep 20
(OUT=$G/g2 LOCK_GATE_CASES=softmax_control timeout 220 scripts/gpu-suite lock_gate > $G/gate2.log 2>&1) &
rm -rf /tmp/sc /tmp/dist; cp -r specs /tmp/sc
(PYTHONPATH="/tmp/site:$PWD" timeout 200 python3 -m specgen.cli build /tmp/sc -o /tmp/dist --name specgen_kernels --locked > $G/build.log 2>&1; echo "build exit $?" >> $G/build.log) &
wait
el "gate and build done"; tail -3 $G/build.log
W=$(ls /tmp/dist/specgen_kernels-*.whl | head -1)
OUT=$G PACKAGE_WHEEL=$W HOST_OVERHEAD_BENCH=0 GENERATED_TESTS_ARGS="-q" timeout 160 scripts/gpu-suite host_overhead > $G/host.log 2>&1
el "generated tests done"
PYTHONPATH="/tmp/site:$PWD:$PWD/tests" SPECGEN_CACHE_DIR=/tmp/specgen-cache timeout 110 python3 dbg/probe.py $G/probe.json > $G/probe.log 2>&1
el "probe done"
rm -f $G/host_overhead/*.whl
echo "== gate"; tail -4 $G/gate1.log; tail -4 $G/gate2.log
echo "== generated tests"; grep -E "passed|failed" $G/host_overhead/generated_tests.log | tail -2
grep -E "^(FAILED|ERROR)" $G/host_overhead/generated_tests.log | head -12 | cut -c1-220
echo "== probe"; grep -E "^(bench|verify)" $G/probe.log | cut -c1-400; tail -3 $G/probe.log | cut -c1-300
el "end"
