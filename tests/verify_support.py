"""The adversarial and good kernels the verifier's tests run, read from the kernels themselves.

Each adversarial `.cu` starts with `// key: value` lines: `spec` (an example spec's name),
`expect` (the verdict reason), optionally `sanitize: yes` and `direction: backward`.
`record()` appends results to the JSON file named by $SPECGEN_VERIFY_SUMMARY (the GPU
suite's summary); without it, nothing is written.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
ADVERSARIAL = TESTS / "adversarial"
GOOD = TESTS / "kernels"
STATIC_REASONS = ("compile-error", "forbidden-symbol", "entry-point-missing")


@dataclass(frozen=True)
class KernelCase:
    path: Path
    spec: str
    expect: str
    sanitize: bool = False
    direction: str | None = None
    static: bool = False  # the static checks (compile, symbols, entry points) decide

    @property
    def decided_statically(self) -> bool:
        return self.static or self.expect in STATIC_REASONS

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def spec_path(self) -> Path:
        return kernel_spec_path(self.spec)


def kernel_spec_path(name: str) -> Path:
    """The spec a hand-written kernel of tests/kernels or tests/adversarial was written for:
    tests/verify_specs/ first (the example spec as it was), else specs/."""
    pinned = TESTS / "verify_specs" / f"{name}.yaml"
    return pinned if pinned.exists() else REPO / "specs" / f"{name}.yaml"


def _header(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^//\s*(spec|expect|sanitize|direction|static):\s*(\S+)", line)
        if m:
            found[m.group(1)] = m.group(2)
        elif not line.startswith("//"):
            break
    return found


def adversarial_kernels() -> list[KernelCase]:
    cases = []
    for path in sorted(ADVERSARIAL.glob("*.cu")):
        meta = _header(path)
        cases.append(KernelCase(path, meta["spec"], meta["expect"], meta.get("sanitize") == "yes",
                                meta.get("direction"), meta.get("static") == "yes"))
    return cases


def good_kernels() -> list[KernelCase]:
    """Correct kernels, each expected to pass: `<spec>.cu`, or `<spec>__<variant>.cu` for another
    correct way to write the same spec (the spec's name is the part before the first `__`)."""
    return [KernelCase(path, path.stem.split("__", 1)[0], "passed") for path in sorted(GOOD.glob("*.cu"))]


def record(section: str, key: str, value) -> None:
    target = os.environ.get("SPECGEN_VERIFY_SUMMARY")
    if not target:
        return
    path = Path(target)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault(section, {})[key] = value
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)
