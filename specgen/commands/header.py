"""`specgen header SPEC`: write the kernel ABI header `<op>_abi.h` for a spec."""
from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("header", help="write a spec's kernel ABI header (<op>_abi.h)",
                              description="Write <op>_abi.h, the C header a kernel for SPEC implements: "
                                          "argument structs and entry points derived from the signature.")
    p.add_argument("spec", metavar="SPEC", help="a spec file")
    p.add_argument("-o", "--output-dir", default=".", help="folder to write into (default: .)")
    p.add_argument("--stdout", action="store_true", help="print the header instead of writing it")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..abi import header_text, write_header
    from ..spec import load_spec

    from . import folder_argument

    spec = load_spec(args.spec)
    if args.stdout:
        sys.stdout.write(header_text(spec))
        return 0
    path = write_header(spec, folder_argument(args.output_dir, "-o/--output-dir"))
    print(f"wrote {path}")
    return 0
