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
    """The `--kernel FILE.cu` of compile, verify and bench, checked to exist."""
    from pathlib import Path

    from ..errors import UsageError

    kernel = Path(text)
    if not kernel.is_file():
        raise UsageError(f"--kernel {text}: no such file; pass the candidate's .cu source")
    return kernel
