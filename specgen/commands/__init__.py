"""One module per CLI command; each defines register(subparsers) and run(args)."""

# Order is the order shown in `specgen --help`.
COMMANDS = [
    "check",
    "init",
    "import_",
    "draft",
    "header",
    "compile",
    "verify",
    "bench",
    "generate",
    "build",
    "report",
]


def kernel_argument(text: str):
    """The `--kernel FILE.cu` of compile, verify and bench: a readable, non-empty UTF-8 text file."""
    from pathlib import Path

    from ..errors import UsageError

    kernel = Path(text)
    if not kernel.exists():
        raise UsageError(f"--kernel {text}: no such file; pass the candidate's .cu source")
    if kernel.is_dir():
        raise UsageError(f"--kernel {text}: is a folder; pass the candidate's .cu source file")
    if not kernel.is_file():
        raise UsageError(f"--kernel {text}: is not a regular file (a device, pipe or socket); pass a .cu file")
    try:
        data = kernel.read_bytes()
    except OSError as error:
        raise UsageError(f"--kernel {text}: cannot read it ({error.strerror or error})") from None
    if not data.strip():
        raise UsageError(f"--kernel {text}: the file is empty; pass the candidate's .cu source")
    if b"\0" in data:
        raise UsageError(f"--kernel {text}: binary data (it contains NUL bytes), not CUDA source text")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"--kernel {text}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return kernel


def folder_argument(text: str, option: str):
    """A folder the command writes into: it may not exist yet, but it must not be a file."""
    from pathlib import Path

    from ..errors import UsageError

    folder = Path(text)
    for part in [folder, *folder.parents]:
        if part.exists():
            if not part.is_dir():
                what = "is a file" if part == folder else f"lies under {part}, which is a file"
                raise UsageError(f"{option} {text}: {what}, not a folder")
            break
    return folder


def load_specs(paths):
    """Every spec named or found in the folders given; two files defining one op are an error."""
    from ..errors import UsageError
    from ..names import op_collisions
    from ..spec import find_spec_files, load_spec

    specs = [load_spec(path) for path in find_spec_files(paths)]
    seen: dict[str, object] = {}
    for spec in specs:
        other = seen.setdefault(spec.name.lower(), spec)
        if other is not spec:
            raise UsageError(f"{spec.path} and {other.path} both define the op {spec.name!r}"
                             + ("" if other.name == spec.name else f" (as {other.name!r}: names differ only "
                                                                   f"in case)")
                             + "; op names must be unique")
    collisions = op_collisions([s.name for s in specs], {s.name: s.backward != "none" for s in specs})
    if collisions:
        raise UsageError("; ".join(collisions) + "; rename one of them")
    return specs


def check_references(specs) -> None:
    """Run every spec's reference once per dtype in the sandbox (specgen/checking.py) before any
    of it runs in this process: an endless loop, an exit or a mutated input stops here."""
    from ..checking import check_reference

    for spec in specs:
        check_reference(spec, samples=1)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse reports anything else as a usage error, exit 2)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def non_negative(text: str) -> float:
    """argparse type: a finite number >= 0."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text} must be a number >= 0")
    return value


def positive(text: str) -> float:
    """argparse type: a finite number > 0."""
    import argparse

    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0")
    return value


def seed_int(text: str) -> int:
    """argparse type: a random seed, 0 <= seed < 2**63."""
    import argparse

    value = non_negative_int(text)
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"{text} is too large for a seed (at most {2**63 - 1})")
    return value


def non_negative_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more")
    return value


def base_url_problem(url: str) -> str | None:
    """Why `url` is no server URL an agent can talk to, or None."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as error:
        return str(error)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        return "not an http(s) URL"
    return None


def fraction(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0 < value <= 1):
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in (0, 1], e.g. 0.8")
    return value
