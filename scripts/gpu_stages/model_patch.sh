# Stage `model_patch` (scripts/gpu-suite model_patch): a transformers Llama model patched with the
# package (`<pkg>.patch(model)`) beside eager and Liger-Kernel's patch, a training step and a
# decode step: benchmarks/model_patch.py. Also the package's own layer tests on the GPU
# (tests/test_layers.py: outputs and gradients of the patched model against the unpatched one),
# and benchmarks/liger_ops.py on the same wheel: issue 13's device-time table of the ops beside
# Liger-Kernel, eager and torch.compile (LIGER_OPS=0 skips it; LIGER_OPS_ARGS adds flags).
# Needs the wheels of transformers, liger-kernel and their dependencies in .whl-model/ (carry it;
# pip download --no-deps ... -d .whl-model; the GPU machine has no internet).
# Knobs: PACKAGE_WHEEL=path.whl (test a wheel built earlier; default: build specs/ --locked),
#   MODEL_PATCH_ARGS (extra benchmarks/model_patch.py flags).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${STAGE_OUT:-${OUT:-/tmp/model-patch-out}/model_patch}"
mkdir -p "$OUT_DIR"
cd "$REPO"
export PYTHONPATH="$REPO:${PYTHONPATH:-}"
if compgen -G "$REPO/.whl-model/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-model-patch "$REPO"/.whl-model/*.whl \
    || echo "model_patch: installing the carried wheels failed" >&2
  export PYTHONPATH="$PYTHONPATH:/tmp/site-model-patch"
fi
PKG=specgen_kernels
WORK="$(mktemp -d /tmp/specgen-model-patch.XXXXXX)"
status=0
if [ -n "${PACKAGE_WHEEL:-}" ]; then
  WHEEL="$PACKAGE_WHEEL"
else
  cp -r specs "$WORK/specs"
  started=$(date +%s)
  timeout 400 python3 -m specgen.cli build "$WORK/specs" -o "$WORK/dist" --name "$PKG" --locked --sdist \
    > "$OUT_DIR/build.log" 2>&1 || { echo "model_patch: build failed"; tail -30 "$OUT_DIR/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - started )) s"
  WHEEL="$(ls "$WORK"/dist/$PKG-*.whl | head -1)"
  sha256sum "$WORK"/dist/* | tee "$OUT_DIR/hashes.txt"
fi
python3 -m pip install -q --no-deps --no-index --target "$WORK/site" "$WHEEL" || exit 1
export PYTHONPATH="$WORK/site:$PYTHONPATH"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_layers.py -rs -k "llama or kernels_hub" 2>&1 \
  | tee "$OUT_DIR/test_layers.log" | tail -5 || status=1
timeout 400 python3 benchmarks/model_patch.py --package "$PKG" --out "$OUT_DIR/model_patch.json" \
  ${MODEL_PATCH_ARGS:-} 2>&1 | tee "$OUT_DIR/model_patch.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ "${LIGER_OPS:-1}" != 0 ]; then
  timeout 300 python3 benchmarks/liger_ops.py --package "$PKG" --dtypes bfloat16,float32 \
    --out "$OUT_DIR/liger_ops.json" ${LIGER_OPS_ARGS:-} 2>&1 | tee "$OUT_DIR/liger_ops.log" | grep -E "^\|"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit $status
