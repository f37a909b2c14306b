"""`specgen verify SPEC --kernel FILE.cu`: run a candidate through every check of the verifier."""
from __future__ import annotations

from rich.markup import escape

from ..errors import EXIT_OK, EXIT_REJECTED, UsageError
from . import non_negative_int, positive, seed_int


def register(subparsers) -> None:
    from ..verify import DEFAULT_EXAMPLES

    p = subparsers.add_parser("verify", help="verify a candidate kernel against its spec (needs a GPU)",
                              description="Compile FILE.cu, check its symbols and entry points, then run it in a "
                                          "worker process against the reference (float64 truth) over boundary and "
                                          "Hypothesis-drawn cases, with the anti-cheat checks. Exit 0 passed, "
                                          "1 rejected (the reason is printed), 3 no GPU or no nvcc. With --locked: "
                                          "re-verify every kernel the lock of SPECS (default specs/) records: a "
                                          "lock record is what the lock says, not a proof.")
    p.add_argument("spec", nargs="*", metavar="SPEC",
                   help="a spec file (with --kernel); with --locked: spec files or folders (default: specs)")
    p.add_argument("--kernel", default=None, metavar="FILE.cu", help="the candidate kernel source")
    p.add_argument("--locked", action="store_true",
                   help="re-verify every locked kernel of SPECS on this GPU; exit 1 if any fails")
    p.add_argument("--record", action="store_true",
                   help="with --locked: add a lock record (this verifier version, this GPU, the benchmark) for "
                        "each locked kernel that passes, so the lock says what was proven here")
    p.add_argument("--examples", type=non_negative_int, default=DEFAULT_EXAMPLES, metavar="N",
                   help=f"Hypothesis cases per direction, on top of the boundary cases (default {DEFAULT_EXAMPLES})")
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help="seed for the drawn cases (default 0)")
    p.add_argument("--sanitize", action="store_true",
                   help="also run compute-sanitizer memcheck and racecheck over a small run")
    p.add_argument("--arch", default=None, help="GPU architecture, e.g. sm_90 (default: the visible GPU)")
    p.add_argument("--timeout", type=positive, default=None, metavar="SECONDS",
                   help="a kernel making no progress for this long is a `timeout` (default 60)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the verdict(s) as JSON to OUT ('-': stdout)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.locked:
        if args.kernel:
            raise UsageError("--locked verifies the kernels the lock records; it takes no --kernel")
        return run_locked(args)
    if getattr(args, "record", False):
        raise UsageError("--record goes with --locked: it adds records to the lock for locked kernels")
    if len(args.spec) != 1 or not args.kernel:
        raise UsageError("verify one kernel with `specgen verify SPEC --kernel FILE.cu`, or every locked kernel "
                         "with `specgen verify --locked [SPECS]`")
    from . import kernel_argument
    from ..spec import load_spec
    from ..verify import verify_kernel

    spec = load_spec(args.spec[0])
    kernel = kernel_argument(args.kernel)
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


def run_locked(args) -> int:
    """Re-verify every kernel the lock records, on the GPU at hand: 0 all passed, 1 any failed,
    2 nothing locked, 3 no GPU. A lock record proves nothing by itself: this is the proof."""
    from ..errors import EnvironmentMissing
    from ..lock import HAND_EDITED, MISSING, STALE, Lock, gpu_available
    from . import load_specs

    specs = load_specs(args.spec or ["specs"])
    locked = []
    for spec in specs:
        lock = Lock.for_spec(spec)
        entry = lock.entry(spec.name)
        if entry is not None and entry.kernel:
            locked.append((spec, lock.status(spec)))
    if not locked:
        raise UsageError(f"no locked kernels in {', '.join(args.spec or ['specs'])}: nothing to verify")
    if not gpu_available():
        raise EnvironmentMissing("specgen verify --locked runs every locked kernel, and no CUDA GPU is visible "
                                 "here; a lock record is what the lock says, not a proof: run this on a GPU machine")
    from .. import verify as verifier

    from ..ui import emit_json, human_console

    out = human_console(args.json)
    failed, report = [], {}
    for spec, status in locked:
        if status.state == MISSING:
            failed.append(spec.name)
            out.print(f"[bold red]FAILED[/] {escape(spec.name)}: {escape(status.reason)}")
            report[spec.name] = {"passed": False, "reason": status.reason}
            continue
        notes = {HAND_EDITED: "the kernel file differs from the locked one: verifying the file as it is",
                 STALE: "the spec changed since the kernel was locked: verifying against the spec as it is"}
        if status.state in notes:
            out.print(f"[yellow]note[/] {escape(spec.name)}: {notes[status.state]}")
        options = dict(examples=args.examples, seed=args.seed, sanitize=args.sanitize, idle_timeout=args.timeout)
        timings = None  # each phase's seconds (compile_s, ...), where a verdict is at hand
        if args.record and status.state not in notes:
            passed, reason, first, recorded, why = _verify_and_record(spec, lock, status, options, args.arch)
        else:
            verdict, recorded = verifier.verify_kernel(spec, status.kernel_path, arch=args.arch, **options), None
            passed, reason, why = bool(verdict.passed), str(verdict.reason), verdict.summary()
            first = (why.splitlines() or [""])[0]
            timings = dict(verdict.timings)
        report[spec.name] = {"passed": passed, "reason": reason, "summary": first, "recorded": recorded,
                             "detail": why, **({"timings": timings} if timings is not None else {})}
        if args.json and args.json != "-":  # the verdicts so far, kept if the run is stopped (a budget)
            emit_json(args.json, report)
        if passed:
            out.print(f"[bold green]ok[/] {escape(spec.name)}: {escape(first)}"
                      + (f" [dim](recorded: {escape(recorded)})[/]" if recorded else ""), soft_wrap=True)
        else:  # the whole verdict: what differed, where, the counterexample, the tolerance
            failed.append(spec.name)
            out.print(f"[bold red]FAILED[/] {escape(spec.name)}: {escape(reason)}:\n{escape(why)}", soft_wrap=True)
    emit_json(args.json, report)
    if failed:
        out.print(f"{len(failed)} of {len(locked)} locked kernel(s) failed verification: {', '.join(failed)}")
        return EXIT_REJECTED
    out.print(f"all {len(locked)} locked kernel(s) verified on this GPU")
    return EXIT_OK


def _verify_and_record(spec, lock, status, options: dict, arch) -> tuple[bool, str, str, str | None, str]:
    """Verify a fresh locked kernel and, when it passes, time it (checked calls) and add the
    record to the lock: (passed, reason, its first line, what was recorded or None, the whole report)."""
    from ..agents.base import Candidate, KernelTask
    from ..agents.evaluate import KernelEvaluator, gpu_facts
    from ..errors import Rejected
    from ..lock import read_kernel

    source = read_kernel(status.kernel_path)
    task = KernelTask.for_spec(spec, gpu=gpu_facts())
    evaluator = KernelEvaluator(task, arch=arch, verify_options=options)
    candidate = Candidate(source, status.entry.agent if status.entry else "locked", None)
    compiled = evaluator.compile(candidate)
    if not compiled.ok:
        return False, "compile-error", (compiled.diagnostics.splitlines() or [""])[0], None, compiled.diagnostics
    verdict = evaluator.verify(candidate, compiled.library)
    if not verdict.passed:
        return False, verdict.reason, (verdict.report.splitlines() or [verdict.reason])[0], None, verdict.report
    try:
        timings = evaluator.measure(candidate, compiled.library)
    except Rejected as error:  # a timed output was wrong, or a time beat physics
        return False, "rejected-by-benchmark", str(error).splitlines()[0][:300], None, str(error)
    records = evaluator.lock_records(candidate, {"verdict_record": verdict.record, "timings": timings})
    for record in records:
        lock.add_record(spec, record)
    first = (verdict.report.splitlines() or ["passed"])[0]
    return (True, "passed", first, ", ".join(f"verifier {r.verifier_version} on {r.gpu_arch}" for r in records) or None,
            verdict.report)
