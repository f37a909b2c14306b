"""Install a package wheel built elsewhere into a fresh folder and run its generated tests.

    python -m specgen.package.check_wheel dist/specgen_kernels-0.1.0-cp39-abi3-linux_x86_64.whl

The proof that the wheel works where it is installed: a wheel built on the GPU machine loads
its compiled kernels here (another Python: the abi3 tag; the same torch minor version, which
a wheel with kernels requires since its binding uses torch's C++ API; wheels of the earlier
stable-ABI binding load under any newer torch), registers them, and passes its tests (on a
machine without a GPU: the CPU ones; the GPU ones skip).
Installs with `pip install --no-deps --target` and PYTHONPATH, which works whether or not
this python is itself a virtual environment. Exit 0 when everything passed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """
import json, sys, torch, importlib
pkg = importlib.import_module(sys.argv[1])
from importlib import import_module
ops = import_module(sys.argv[1] + "._spec_data").OPS
kernels = [name for name, op in ops.items() if op["has_kernel"]]
ns = getattr(import_module(sys.argv[1] + "._spec_data"), "NAMESPACE", sys.argv[1])  # older wheels: the package name
def compiled(name):
    if torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::_{name}_kernel", "CUDA"):
        return True  # a wheel of the earlier stable-ABI binding: private kernel ops
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{name}", "CUDA"):
        return False
    table = torch._C._dispatch_dump_table(f"{ns}::{name}")
    return any(l.startswith("CUDA:") and "torch_binding.cpp" in l for l in table.splitlines())
# an op with a batch group (Tensor[*B, ...]) has its kernel on `<op>_rows` (its public op is a composite)
registered = [name for name in kernels if compiled(ops[name].get("rows", name))]
print(json.dumps({"torch": torch.__version__, "python": sys.version.split()[0], "file": pkg.__file__,
                  "kernels_loaded": pkg.CUDA_KERNELS_LOADED, "error": str(pkg.CUDA_KERNELS_ERROR or ""),
                  "kernel_ops": kernels, "registered": registered, "unverified": pkg.UNVERIFIED_OPS}))
"""


def package_name(wheel: Path) -> str:
    return wheel.name.split("-")[0]


def install(wheel: Path, site: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)


def probe(package: str, site: Path, cwd: Path) -> dict:
    """What loaded: torch/python here, whether `_C` loaded and registered every kernel op."""
    env = dict(os.environ, PYTHONPATH=str(site))
    result = subprocess.run([sys.executable, "-c", PROBE, package], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"importing {package} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_tests(package: str, site: Path, cwd: Path, extra: list[str] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           "--pyargs", f"{package}.tests", *extra], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1800)


def check_wheel(wheel: Path, work: Path) -> tuple[dict, subprocess.CompletedProcess]:
    package = package_name(wheel)
    site = work / "site"
    install(wheel, site)
    return probe(package, site, work), run_tests(package, site, work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", type=Path)
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        print(f"{args.wheel}: no such wheel", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="specgen-check-wheel-") as work:
        info, tests = check_wheel(args.wheel.resolve(), Path(work))
    print(tests.stdout[-4000:])
    print(json.dumps(info, indent=2))
    loaded = info["kernels_loaded"] and sorted(info["registered"]) == sorted(info["kernel_ops"])
    if info["kernel_ops"] and not loaded:
        print(f"the compiled kernels did not load or register here: {info['error']}", file=sys.stderr)
        return 1
    return tests.returncode


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
