"""`specgen verify SPEC --kernel FILE.cu`: run a candidate through every check of the verifier."""
from __future__ import annotations

from rich.markup import escape

from ..errors import EXIT_OK, EXIT_REJECTED, UsageError


def register(subparsers) -> None:
    from ..verify import DEFAULT_EXAMPLES

    p = subparsers.add_parser("verify", help="verify a candidate kernel against its spec (needs a GPU)",
                              description="Compile FILE.cu, check its symbols and entry points, then run it in a "
                                          "worker process against the reference (float64 truth) over boundary and "
                                          "Hypothesis-drawn cases, with the anti-cheat checks. Exit 0 passed, "
                                          "1 rejected (the reason is printed), 3 no GPU or no nvcc.")
    p.add_argument("spec", metavar="SPEC", help="a spec file")
    p.add_argument("--kernel", required=True, metavar="FILE.cu", help="the candidate kernel source")
    p.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, metavar="N",
                   help=f"Hypothesis cases per direction, on top of the boundary cases (default {DEFAULT_EXAMPLES})")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed for the drawn cases (default 0)")
    p.add_argument("--sanitize", action="store_true",
                   help="also run compute-sanitizer memcheck and racecheck over a small run")
    p.add_argument("--arch", default=None, help="GPU architecture, e.g. sm_90 (default: the visible GPU)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="a kernel making no progress for this long is a `timeout` (default 60)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the verdict as JSON to OUT ('-': stdout)")
    p.set_defaults(func=run)


def run(args) -> int:
    from . import kernel_argument
    from ..spec import load_spec
    from ..verify import verify_kernel

    spec = load_spec(args.spec)
    kernel = kernel_argument(args.kernel)
    if args.examples < 0:
        raise UsageError(f"--examples {args.examples}: give a count >= 0")
    from ..ui import Progress, emit_json, human_console

    with Progress().stage(f"verifying {kernel} against {spec.name}") as stage:
        verdict = verify_kernel(spec, kernel, examples=args.examples, seed=args.seed, sanitize=args.sanitize,
                                arch=args.arch, idle_timeout=args.timeout, on_progress=stage.update)
    emit_json(args.json, verdict.to_json())
    out = human_console(args.json)
    colour = "green" if verdict.passed else "red"
    lines = verdict.summary().splitlines()
    out.print(f"[bold {colour}]{escape(lines[0])}[/]")
    for line in lines[1:]:
        out.print(escape(line), soft_wrap=True)
    shown = {k: v for k, v in verdict.timings.items() if k != "fatal"}
    if shown:
        out.print("timings: " + ", ".join(f"{k}={v}" for k, v in shown.items()), style="dim")
    return EXIT_OK if verdict.passed else EXIT_REJECTED
