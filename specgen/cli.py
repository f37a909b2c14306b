"""The `specgen` command line: a thin argparse front end over specgen.commands."""
from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console
from rich.markup import escape

from . import __version__
from .commands import COMMANDS
from .errors import EXIT_REJECTED, EXIT_USAGE, SpecgenError

err_console = Console(stderr=True, highlight=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specgen",
        description="Kernel specs in, verified CUDA kernels and installable wheels out.",
    )
    parser.add_argument("--version", action="version", version=f"specgen {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"specgen.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .interrupts import Terminated, termination_as_interrupt

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from .ui import restart_clock

    restart_clock()
    try:
        with termination_as_interrupt():
            return int(args.func(args) or 0)
    except SpecgenError as error:
        err_console.print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True)
        return error.exit_code
    except Terminated as stop:
        err_console.print(f"stopped by signal {stop.signum}")
        return stop.exit_code
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except RecursionError as error:  # e.g. a pathological input deep inside a library
        return _internal_error(error)
    except Exception as error:  # noqa: BLE001 - no traceback reaches the user (SPECGEN_DEBUG=1 shows it)
        return _internal_error(error)


def _internal_error(error: BaseException) -> int:
    import os

    if os.environ.get("SPECGEN_DEBUG"):
        raise error
    err_console.print(f"[bold red]internal error:[/] {escape(type(error).__name__)}: {escape(str(error)[:500])}\n"
                      f"  this is a bug in specgen, not in your input: please report it with the command line "
                      f"(SPECGEN_DEBUG=1 shows the traceback)", soft_wrap=True)
    return EXIT_REJECTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
