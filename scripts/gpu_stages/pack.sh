# Stage `pack`, last in a call: the device tool brings back a limited number of files, so
# everything under $OUT becomes one tarball ($OUT/call.tgz) beside one short summary
# ($OUT/summary.txt: the GPU, each earlier stage's exit line and its result lines, the level-1
# tables). Needs the stages' console output: run the suite as
#   scripts/gpu-suite STAGES... pack 2>&1 | tee "$OUT/console.log"
# (without console.log the summary holds the GPU and the level-1 tables only).
set -uo pipefail
cd "$OUT" || exit 1
OUT="$(pwd -P)"  # absolute: a relative OUT resolved again from inside it named another folder
[ "$OUT" = / ] && { echo "pack: OUT is /" >&2; exit 1; }
summary="$(mktemp)" tarball="$(mktemp)"
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
} > "$summary"
# nothing is deleted unless the tarball was written whole (a full disk must not lose the call)
if ! tar czf "$tarball" --exclude ./summary.txt --exclude ./call.tgz --exclude ./pack .; then
  echo "pack: tar failed; $OUT left as it was" >&2
  mv "$summary" "$OUT/summary.txt"
  exit 1
fi
find "$OUT" -mindepth 1 -delete
mv "$tarball" "$OUT/call.tgz" && mv "$summary" "$OUT/summary.txt"
cat "$OUT/summary.txt"
