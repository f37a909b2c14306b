"""Which glibc a built wheel needs: a wheel built on a new distribution may not load on an
older one (glibc 2.38 renamed strtol & co.), so the build says so instead of the user's
import failing later."""
from __future__ import annotations

import re
import tempfile
import zipfile
from pathlib import Path

from ..toolchain import undefined_dynamic_symbols

# manylinux_2_28: what most current distributions have (RHEL 8, Debian 10, Ubuntu 18.10 on).
PORTABLE_GLIBC = (2, 28)
_GLIBC = re.compile(r"^GLIBC_(\d+)\.(\d+)")


def glibc_needs(library: Path) -> dict[str, tuple[int, int]]:
    """Each versioned glibc symbol the library imports, with the glibc version it needs."""
    needs = {}
    for symbol in undefined_dynamic_symbols(library):
        if symbol.version and (match := _GLIBC.match(symbol.version)):
            needs[symbol.name] = (int(match[1]), int(match[2]))
    return needs


def wheel_glibc_needs(wheel: Path) -> dict[str, tuple[int, int]]:
    """glibc_needs over every shared library inside a wheel."""
    needs: dict[str, tuple[int, int]] = {}
    if not zipfile.is_zipfile(wheel):  # advisory only: a broken wheel is reported where it is installed
        return needs
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as scratch:
        for name in archive.namelist():
            if name.endswith(".so") or ".so." in name:
                needs.update(glibc_needs(Path(archive.extract(name, scratch))))
    return needs


def portability_warning(wheel: Path, floor: tuple[int, int] = PORTABLE_GLIBC) -> str | None:
    """A sentence for the user when the wheel needs a glibc newer than `floor`, else None."""
    above = {name: v for name, v in wheel_glibc_needs(wheel).items() if v > floor}
    if not above:
        return None
    newest = max(above.values())
    symbols = ", ".join(f"{name} (GLIBC_{v[0]}.{v[1]})" for name, v in sorted(above.items(), key=lambda kv: kv[1]))
    return (f"{wheel.name} needs glibc >= {newest[0]}.{newest[1]} (newer than manylinux_{floor[0]}_{floor[1]}): "
            f"it will not load on Linux systems with an older glibc. Symbols: {symbols}. "
            f"Build on the oldest system you must support.")
