#!/usr/bin/env bash
# On the GPU machine (torch 2.11, Python 3.12): build the probe's abi3 wheel, install it in a
# fresh venv, run it on CUDA against the reference, and leave the wheel + logs in $OUT.
#   bash scripts/stable_abi_probe/gpu_check.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-/tmp/stable_probe_out}"
mkdir -p "$OUT"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
WORK="$(mktemp -d)"
cp -r "$HERE"/. "$WORK/src"
rm -rf "$WORK/src/build" "$WORK/src/dist" "$WORK"/src/*.egg-info
cd "$WORK/src"
start=$(date +%s)
if python -c "import build" 2>/dev/null; then
  BUILD=(python -m build --wheel --no-isolation --outdir "$WORK/dist")
else  # no `build` on this machine: pip builds the same wheel
  BUILD=(python -m pip wheel --no-build-isolation --no-deps -w "$WORK/dist" .)
fi
"${BUILD[@]}" > "$OUT/probe_build.log" 2>&1 || { tail -40 "$OUT/probe_build.log"; exit 1; }
echo "wheel built in $(( $(date +%s) - start )) s: $(ls "$WORK/dist")"
cp "$WORK"/dist/*.whl "$OUT/"
# python may itself be a venv (then a --system-site-packages venv would not see torch):
# install into a fresh target folder instead and put it first on PYTHONPATH.
python -m pip install --no-deps --no-index -q --target "$WORK/site" "$WORK"/dist/*.whl
cd "$WORK"  # away from the source tree, so the installed package is the one imported
cp "$HERE/check_probe.py" "$WORK/"  # run a copy: the script's folder must not shadow the install
PYTHONPATH="$WORK/site" python "$WORK/check_probe.py" 2>&1 | tee "$OUT/probe_gpu_check.txt"
