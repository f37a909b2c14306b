#!/usr/bin/env bash
# Here (no GPU, another torch and Python): install a wheel built elsewhere, run the CPU checks.
#   bash scripts/stable_abi_probe/cpu_check.sh PATH/TO/stable_probe-0.0.1-cp39-abi3-linux_x86_64.whl
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
WHEEL="$(realpath "$1")"
WORK="$(mktemp -d)"
python -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install --no-deps --no-index -q "$WHEEL"
cd "$WORK"
cp "$HERE/check_probe.py" "$WORK/"  # run a copy: the script's folder must not shadow the install
"$WORK/venv/bin/python" "$WORK/check_probe.py"
