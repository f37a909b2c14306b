#!/usr/bin/env bash
# Reproduces, on a Debian machine with root and Debian's package mirror, the way the H200's
# wheel failed to load on an older glibc, and checks the package's fix:
#   a shared library that links libstdc++ statically from a toolchain on glibc >= 2.38 imports
#   __isoc23_strtoul@GLIBC_2.38; with templates/package/torch-ext/glibc_{compat.h,shims.cpp}
#   it must not, and it must load and run on this (older) glibc.
#   bash scripts/glibc_shim_check.sh [ROOTFS]      (about a minute; writes ROOTFS, default /tmp/trixie)
set -euo pipefail
ROOT="${1:-/tmp/trixie}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap
[ -x "$ROOT/usr/bin/g++" ] || debootstrap --variant=minbase --include=g++,binutils trixie "$ROOT" http://deb.debian.org/debian
mkdir -p "$ROOT/work"
python3 - "$ROOT/work" <<'PY'
import sys
from specgen.package.emit import environment
env, out = environment(), sys.argv[1]
for name in ("glibc_compat.h", "glibc_shims.cpp"):
    open(f"{out}/{name}", "w").write(env.get_template(f"torch-ext/{name}.j2").render())
PY
cat > "$ROOT/work/app.cpp" <<'CPP'
// Pulls libstdc++.a's random.o (std::random_device parses its token with strtoul).
#include <random>
#include <string>
extern "C" unsigned long entropy_and_parse(const char* s) {
  std::random_device rd("default");
  return std::stoul(std::string(s)) + (rd() & 0);
}
CPP
chroot "$ROOT" /bin/bash -c 'cd /work && g++ --version | head -1 && ldd --version | head -1 &&
  g++ -shared -fPIC -O2 -static-libstdc++ -static-libgcc app.cpp -o libnoshim.so &&
  g++ -shared -fPIC -O2 -static-libstdc++ -static-libgcc -include glibc_compat.h app.cpp glibc_shims.cpp -o libshim.so'
cd "$ROOT/work"
echo "this machine: $(ldd --version | head -1)"
python3 - <<'PY'
import ctypes, subprocess, sys
def imports_c23(lib):
    syms = subprocess.run(["readelf", "-W", "--dyn-syms", lib], capture_output=True, text=True).stdout
    return "__isoc23_" in syms
def loads(lib):
    try:
        f = ctypes.CDLL(f"./{lib}").entropy_and_parse
        f.restype = ctypes.c_ulong
        return f(b"12345") == 12345
    except OSError as error:
        print(f"  {lib}: {error}")
        return False
print(f"without the shims: imports __isoc23_*: {imports_c23('libnoshim.so')}, loads here: {loads('libnoshim.so')}")
print(f"with the shims:    imports __isoc23_*: {imports_c23('libshim.so')}, loads here: {loads('libshim.so')}")
ok = imports_c23("libnoshim.so") and not imports_c23("libshim.so") and loads("libshim.so")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
