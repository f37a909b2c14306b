"""`--hub-layout DIR`: the wheel's package as a Hugging Face kernel repository build variant.

Writes DIR/build/<variant>/metadata.json and DIR/build/<variant>/<pkg>/ (the installed
package, compiled extension included), loadable by `kernels.get_local_kernel(DIR)`. A package
with kernels is the variant `torch<MAJ><MIN>-cxx11-cu<XY>-<cpu>-linux` (`cxx98` for a torch
built with the old C++ ABI): its binding is compiled against torch MAJ.MIN's C++ API, so
`kernels` picks it for that torch only, as for kernel-builder's own builds. A package without
compiled code is `torch-stable-abi<MAJ><MIN>-cu<XY>-<cpu>-linux` with the oldest torch its
Python supports: every newer torch accepts it.
"""
from __future__ import annotations

import hashlib
import json
import platform
import shutil
import zipfile
from pathlib import Path

from ..fsutil import write_atomic
from .model import PackageModel


def variant_name(pkg: PackageModel, cuda_version: str) -> str:
    cuda = "cu" + "".join(cuda_version.split(".")[:2])
    if pkg.has_kernels:
        major, minor = pkg.torch_version
        abi = "cxx11" if pkg.torch_cxx11_abi else "cxx98"
        return f"torch{major}{minor}-{abi}-{cuda}-{platform.machine()}-linux"
    major, minor = pkg.torch_target
    return f"torch-stable-abi{major}{minor}-{cuda}-{platform.machine()}-linux"


def metadata(pkg: PackageModel, wheel: Path) -> dict:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:10]
    return {
        "name": pkg.hub_name,  # kernels' rule: ^[a-z][-a-z0-9]*[a-z0-9]$ (it imports <name with _>/)
        "id": f"_{pkg.namespace}_{digest}",  # the module name kernels imports it under
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cuda", "archs": pkg.cuda_capabilities},
    }


def write_hub_layout(pkg: PackageModel, wheel: str | Path, hub_dir: str | Path, cuda_version: str) -> Path:
    """Unpack the wheel's package into hub_dir/build/<variant>/; returns the variant folder."""
    wheel = Path(wheel)
    variant = Path(hub_dir) / "build" / variant_name(pkg, cuda_version)
    if variant.exists():
        shutil.rmtree(variant)
    prefix = f"{pkg.name}/"
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            parts = Path(member).parts
            if member.startswith(prefix) and not member.endswith("/") and ".." not in parts \
                    and not Path(member).is_absolute():  # never outside the variant folder
                write_atomic(variant / member, archive.read(member))
    write_atomic(variant / "metadata.json", json.dumps(metadata(pkg, wheel), indent=2) + "\n")
    return variant
