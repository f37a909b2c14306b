"""One module per CLI command; each defines register(subparsers) and run(args)."""

# Order is the order shown in `specgen --help`.
COMMANDS = [
    "check",
    "init",
    "header",
    "compile",
    "verify",
    "bench",
    "generate",
    "build",
]
