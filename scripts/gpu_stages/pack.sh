# Stage `pack`, last in a call: the device tool brings back a limited number of files, so
# everything under $OUT becomes one tarball ($OUT/call.tgz) beside one short summary
# ($OUT/summary.txt: the GPU, each earlier stage's exit line and its result lines, the level-1
# tables). Needs the stages' console output: run the suite as
#   scripts/gpu-suite STAGES... pack 2>&1 | tee "$OUT/console.log"
# (without console.log the summary holds the GPU and the level-1 tables only).
set -uo pipefail
cd "$OUT" || exit 1
{
  head -2 environment.txt 2>/dev/null
  if [ -f console.log ]; then
    grep -E "^(== stage|gputests: |E  |FAILED|ERROR|\[level1\] (lowering|wrote)|variant_ab|geometric mean)" console.log \
      | grep -v "== stage pack" | cut -c1-300
  fi
  for f in level1/dev.log level1/heldout.log; do
    [ -f "$f" ] && { echo "== $f"; grep -vE "^\[level1\] spec " "$f" | tail -n 24 | cut -c1-220; }
  done
  [ -f ab/variant_ab.md ] && { echo "== ab/variant_ab.md"; tail -n 40 ab/variant_ab.md | cut -c1-220; }
} > /tmp/pack-summary.txt
tar czf /tmp/pack-call.tgz --exclude ./summary.txt --exclude ./call.tgz --exclude ./pack .
find "$OUT" -mindepth 1 -delete
mv /tmp/pack-call.tgz "$OUT/call.tgz" && mv /tmp/pack-summary.txt "$OUT/summary.txt"
cat "$OUT/summary.txt"
