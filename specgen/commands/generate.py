"""`specgen generate SPEC... --agent NAME`: write a kernel for each spec with an agent.

Runs the generate → compile → verify → measure → improve loop and writes the winner
through the lock (specs/kernels/<op>.cu + specs/specgen.lock). Without a GPU only the
compile feedback runs: the first candidate that compiles is written without a
verification record (unless that would replace an existing kernel).

The builtin agent on a GPU autotunes instead (agents/builtin/tune.py): every schedule
variant that matters for the spec, verified and timed within --tune-budget seconds, the
fastest kept, and the reference path kept where it is slower than eager; the tuning record
goes into the lock, and a run with nothing changed reuses it without touching the GPU.
"""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..agents.base import AgentRefused
from ..errors import EXIT_OK, EXIT_REJECTED, Rejected, UsageError
from . import base_url_problem, fraction, non_negative, non_negative_int, positive, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate", help="write a kernel for each spec with an agent (LLM or built-in)",
        description="Generate, compile, verify and measure kernels for SPEC files with an agent, "
                    "feeding each attempt's compiler errors, counterexample and timings back into "
                    "the next; the best verified kernel goes into the lock.")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files or folders of specs")
    add_agent_arguments(p)
    p.add_argument("--regenerate", action="store_true",
                   help="replace a hand-edited kernel, or a locked one with an unverified one")
    p.add_argument("--json", default=None, metavar="OUT",
                   help="also write each spec's outcome as JSON to OUT ('-': stdout)")
    from ..scale import add_scale_arguments  # scale-out (specgen/scale/, docs/SCALE.md)

    add_scale_arguments(p)
    p.set_defaults(func=run)


def add_agent_arguments(parser) -> None:
    """The agent and loop options, shared by `specgen generate` and `specgen build` (one group)."""
    g = parser.add_argument_group("agent and loop")
    g.add_argument("--agent", default="builtin",
                   help="builtin (default, offline), openai, anthropic, openai-compatible, replay")
    g.add_argument("--model", default=None, help="model name (default: per agent, see models.toml)")
    g.add_argument("--base-url", default=None, metavar="URL",
                   help="server URL (openai-compatible: e.g. http://localhost:8000/v1)")
    g.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="environment variable holding the API key (default: OPENAI_API_KEY / "
                        "ANTHROPIC_API_KEY; openai-compatible: none)")
    g.add_argument("--transcript", default=None, metavar="FILE", help="replay: the transcript to rerun")
    g.add_argument("--attempts", type=positive_int, default=8, help="candidates per spec (default 8)")
    g.add_argument("--samples", type=positive_int, default=1,
                   help="candidates proposed in parallel per round (default 1)")
    g.add_argument("--budget-usd", type=non_negative, default=None, metavar="X", help="stop once a spec cost X USD")
    g.add_argument("--wall-time", type=positive, default=None, metavar="S", help="stop a spec after S seconds")
    g.add_argument("--target-roofline", type=fraction, default=0.8, metavar="F",
                   help="stop once a verified kernel reaches this fraction of the memory roofline "
                        "(default 0.8)")
    g.add_argument("--transcript-dir", default=".specgen/transcripts", metavar="DIR",
                   help="where the JSONL transcripts go (default .specgen/transcripts)")
    g.add_argument("--timeout", type=positive, default=600.0, metavar="S", help="per LLM request (default 600)")
    g.add_argument("--retries", type=non_negative_int, default=4,
                   help="per LLM request on 429/5xx/timeouts (default 4)")
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--arch", default=None, help="GPU architecture, e.g. sm_90 (default: the visible GPU)")
    g.add_argument("--tune-budget", type=positive, default=None, metavar="SECONDS",
                   help="builtin agent on a GPU: seconds per spec to verify and time schedule variants "
                        "(default %g; the first verified variant is always finished)" % _default_budget())
    g.add_argument("--no-tune", action="store_true",
                   help="builtin agent: no autotuning, the default variant alone (as without a GPU)")
    g.add_argument("--retune", action="store_true",
                   help="builtin agent: tune again even when the lock's tuning record still applies")
    sanitizing = g.add_mutually_exclusive_group()
    sanitizing.add_argument("--sanitize", action="store_true",
                            help="run every candidate under compute-sanitizer (memcheck, racecheck, initcheck); "
                                 "by default only the kernel about to be locked runs under it")
    sanitizing.add_argument("--no-sanitize", action="store_true",
                            help="lock without compute-sanitizer (it runs by default on a GPU over the kernel "
                                 "about to be locked, about 50 s a kernel); the lock record says so")


def _default_budget() -> float:
    from ..agents.builtin.tune import DEFAULT_BUDGET_S

    return DEFAULT_BUDGET_S


def run(args) -> int:
    from ..agents.registry import AgentOptions, create_agent, load_catalog
    from . import check_references, load_specs

    check_agent_arguments(args)
    specs = load_specs(args.specs)
    check_references(specs)
    from ..ui import Progress, emit_json, human_console

    console = human_console(args.json)
    progress = Progress()
    catalog = load_catalog()
    options = AgentOptions(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env,
                           timeout_s=args.timeout, max_retries=args.retries, temperature=args.temperature,
                           transcript=Path(args.transcript) if args.transcript else None, catalog=catalog)
    agent = create_agent(args.agent, options)
    if args.budget_usd is not None and agent.model and catalog.info(agent.model).input_per_mtok is None \
            and args.agent not in ("builtin", "replay"):
        console.print(f"[yellow]warning:[/] no price known for model {escape(agent.model)}; "
                      f"--budget-usd counts it as free (add it to {escape(str(catalog.source or 'models.toml'))})")
    from ..scale import scaled

    if scaled(args):  # scale-out: one GPU task per spec, the lock adopted here (specgen/scale/run.py)
        from ..scale.run import Session

        code, outcomes = Session(args, console).generate(specs)
        emit_json(args.json, {"ok": code == EXIT_OK, "specs": outcomes})
        return code
    code = EXIT_OK
    outcomes = []
    for spec in specs:
        with progress.stage(f"generating {spec.name} with {agent.name}", done=False):
            try:
                result = generate_one(spec, agent, args, console)
            except AgentRefused as refusal:  # this op only: the other specs still get their turn
                console.print(f"  [red]refused[/]: {escape(str(refusal))}", soft_wrap=True)
                result = EXIT_REJECTED
        outcome = spec_outcome(spec)
        if not outcome["verified"]:
            result = max(result, EXIT_REJECTED)
            console.print(f"  [yellow]{escape(spec.name)} has no verified kernel[/] ({escape(outcome['state'])}): "
                          f"exit 1", soft_wrap=True)
        outcomes.append({**outcome, "exit_code": result})
        code = max(code, result)
    emit_json(args.json, {"ok": code == EXIT_OK, "specs": outcomes})
    return code


def spec_outcome(spec) -> dict:
    """Where the spec ends: its lock state and whether its locked kernel has a passing GPU record."""
    from .. import lock

    status = lock.status(spec)
    entry = status.entry
    verified = bool(entry is not None and entry.kernel and status.state == lock.FRESH and entry.verified_on())
    state = status.state if entry is None or entry.kernel else "reference path"
    if entry is not None and entry.kernel and not entry.verified_on():
        state = f"{state}, not verified on a GPU"
    tuning = entry.tuning if entry is not None and entry.spec_hash == spec.hash() else None
    return {"op": spec.name, "spec": str(spec.path), "state": state, "verified": verified,
            "kernel": str(status.kernel_path) if entry is not None and entry.kernel else None,
            "agent": entry.agent if entry is not None else None,
            "tuning": {k: tuning.get(k) for k in ("variant", "decision", "spent_s", "budget_s", "complete")}
            if tuning else None}


def check_agent_arguments(args) -> None:
    """What argparse cannot check alone, before any spec is read or any agent started."""
    if args.target_roofline is not None and not 0 < args.target_roofline <= 1:
        raise UsageError(f"--target-roofline {args.target_roofline}: give a fraction in (0, 1]")
    if args.base_url is not None and (problem := base_url_problem(args.base_url)):
        raise UsageError(f"--base-url {args.base_url!r}: {problem}; write e.g. http://localhost:8000/v1")
    from . import folder_argument

    folder_argument(args.transcript_dir, "--transcript-dir")


def generate_one(spec, agent, args, console: Console) -> int:
    from .. import lock
    from ..agents.base import Candidate, KernelTask
    from ..agents.evaluate import KernelEvaluator, gpu_facts
    from ..agents.loop import Budget, run_loop
    from ..agents.transcript import Transcript, default_path

    status = lock.status(spec)
    if agent.name == "builtin" and not getattr(args, "no_tune", False):
        from ..agents.builtin import tune

        backend = tune.make_backend(args.arch, sanitize=getattr(args, "sanitize", False))
        if backend is not None:
            return tune_one(spec, backend, args, console, status)
    baseline = None
    if status.entry is not None and status.kernel_path and Path(status.kernel_path).is_file():
        baseline = Candidate(lock.read_kernel(Path(status.kernel_path)), status.entry.agent, status.entry.model)
    task = KernelTask.for_spec(spec, gpu=gpu_facts(), baseline=baseline)
    evaluator = KernelEvaluator(task, arch=args.arch, verify_options=verify_options(args))
    if baseline is not None and evaluator.can_verify:
        task.baseline_timings = _baseline_timings(evaluator, baseline)
    budget = Budget(attempts=args.attempts, samples=args.samples, wall_time_s=args.wall_time,
                    cost_usd=args.budget_usd, target_roofline=args.target_roofline)
    transcript_path = default_path(Path(args.transcript_dir), spec.name)
    console.print(f"[bold]{escape(spec.name)}[/]: agent {agent.name}"
                  + (f" ({escape(agent.model)})" if agent.model else "")
                  + ("" if evaluator.can_verify else " — no GPU here: compile feedback only"))

    def show(number, attempt):
        console.print(f"  attempt {number}: {_outcome(attempt)}")

    result = run_loop(task, agent, evaluator, budget, Transcript(transcript_path), on_attempt=show)
    usage = result.usage
    console.print(f"  stopped: {escape(result.stopped)}; {usage.input_tokens}+{usage.output_tokens} tokens, "
                  f"${usage.cost_usd:.4f}; transcript {escape(str(transcript_path))}")
    for note in result.notes:
        console.print(f"  note: {escape(note)}")

    if result.winner is not None:
        if result.beats_baseline is False:
            console.print(f"  kept the locked kernel by {escape(baseline.agent)}: it is faster")
            return EXIT_OK
        records = evaluator.lock_records(result.winner, result.winner_attempt.details)
        if records:  # verified on this GPU: the sanitizer gate before the lock
            sanitized = sanitizer_gate(
                args, console, lambda: _sanitize_source(spec, evaluator, result.winner))
            if sanitized is None:
                return EXIT_REJECTED
            records[0].verification.update(sanitized)
        kernel = lock.write_kernel(spec, result.winner.source, agent=result.winner.agent,
                                   model=result.winner.model, records=records, regenerate=args.regenerate)
        console.print(f"  [green]wrote[/] {escape(str(kernel))} (verified"
                      + (", recorded in the lock)" if records else ")"))
        return EXIT_OK
    if result.compiled is not None and not result.verified:
        if baseline is not None and not args.regenerate:
            console.print("  [yellow]not written[/]: it compiled but cannot be verified here, and the lock "
                          "already has a kernel; pass --regenerate to replace it")
            return EXIT_OK
        kernel = lock.write_kernel(spec, result.compiled.source, agent=result.compiled.agent,
                                   model=result.compiled.model, regenerate=args.regenerate)
        console.print(f"  [yellow]wrote[/] {escape(str(kernel))} [yellow]unverified[/] (no GPU here): "
                      f"run `specgen verify` on a GPU machine")
        return EXIT_OK
    console.print(f"  [red]no kernel[/] for {escape(spec.name)}: {escape(result.stopped)}; the package "
                  f"keeps the reference path for this op")
    return EXIT_REJECTED


def tune_one(spec, backend, args, console: Console, status) -> int:
    """The builtin agent on a GPU: reuse the lock's tuning record when its key still holds,
    else tune (agents/builtin/tune.py) and lock the chosen kernel, or the reference path."""
    from .. import lock
    from ..agents.builtin import tune
    from ..package.reference_lock import is_reference_entry
    from ..verify import VERIFIER_VERSION

    entry = status.entry
    key = tune.tuning_key(spec, backend.arch)
    reference_fresh = is_reference_entry(entry) and entry.spec_hash == spec.hash()
    if not getattr(args, "retune", False) and tune.reusable(entry, key) and (status.state == lock.FRESH
                                                                           or reference_fresh):
        console.print(f"[bold]{escape(spec.name)}[/]: builtin, tuning reused from the lock (same spec, "
                      f"generator, GPU arch {escape(key['gpu_arch'])}, verifier version): nothing re-run")
        for line in tune.summary_lines(entry.tuning):
            console.print(f"  {escape(line)}", soft_wrap=True)
        return EXIT_OK
    if status.state == lock.HAND_EDITED and not args.regenerate:
        raise lock.LockError(f"{status.kernel_path}: {status.reason}; refusing to overwrite a hand-edited "
                             f"kernel. Verify it (`specgen verify`), or pass --regenerate to replace it")
    why = "; ".join(tune.key_changes(entry, key)) if entry is not None and entry.tuning else "not tuned yet"
    if getattr(args, "retune", False):
        why = "--retune"
    budget = args.tune_budget if getattr(args, "tune_budget", None) is not None else tune.DEFAULT_BUDGET_S
    console.print(f"[bold]{escape(spec.name)}[/]: agent builtin, autotuning on {escape(backend.arch)} "
                  f"within {budget:g} s ({escape(why)})")
    baseline = None
    if status.state == lock.FRESH and entry is not None and entry.kernel and entry.agent != "builtin":
        baseline = (entry.agent, lock.read_kernel(Path(status.kernel_path)))
    try:
        result = tune.tune(spec, backend, budget_s=budget, baseline=baseline, prefer=tune.previous_variants(entry),
                           say=lambda text: console.print(f"  {escape(text)}", soft_wrap=True))
    except Rejected as error:  # no variant verified: as when an agent's candidates all fail
        console.print(f"  [red]no kernel[/] for {escape(spec.name)}: {escape(str(error))}; the package keeps "
                      f"the reference path for this op", soft_wrap=True)
        return EXIT_REJECTED
    for line in tune.summary_lines(result.record):
        console.print(f"  {escape(line)}", soft_wrap=True)
    for note in result.notes:
        console.print(f"  note: {escape(note)}", soft_wrap=True)
    if result.decision == "baseline":
        console.print(f"  kept the locked kernel by {escape(baseline[0])}: it is faster")
        return EXIT_OK
    if result.decision == tune.REFERENCE and baseline is not None:
        console.print(f"  kept the locked kernel by {escape(baseline[0])}: the tuned builtin kernel is slower "
                      f"than eager")
        return EXIT_OK
    if result.decision == tune.REFERENCE:
        reason = result.record["reason"]
        ours = entry is None or entry.agent == "builtin"  # another agent's kernel is never removed here
        if lock.write_reference(spec, "builtin", reason, tuning=result.record, replace_kernel=ours):
            console.print(f"  [yellow]reference path[/] kept for {escape(spec.name)}: {escape(reason)}",
                          soft_wrap=True)
        else:
            console.print(f"  [yellow]not written[/]: the tuned kernel is slower than eager, and "
                          f"{escape(str(status.kernel_path))} is not the builtin generator's; left as it is")
        return EXIT_REJECTED
    sanitized = sanitizer_gate(args, console, lambda: backend.sanitize_chosen(spec, result.source))
    if sanitized is None:
        return EXIT_REJECTED
    verification = {**(result.verification or {"passed": True}), "variant": result.variant, **sanitized}
    record = lock.Record(kernel_hash=lock.kernel_hash(result.source), verifier_version=str(VERIFIER_VERSION),
                         gpu_arch=backend.arch, verification=verification, benchmark=result.benchmark)
    kernel = lock.write_kernel(spec, result.source, agent="builtin", model=None, records=[record],
                               regenerate=args.regenerate, tuning=result.record)
    console.print(f"  [green]wrote[/] {escape(str(kernel))} (variant {escape(result.variant)}, verified, "
                  f"tuning recorded in the lock)")
    return EXIT_OK


def sanitizer_gate(args, console: Console, run) -> dict | None:
    """compute-sanitizer over the kernel about to be locked (`run()`: per-tool seconds, None when no
    sanitizer is installed): the lock record's fields, or None when it found something (nothing
    is locked; the package keeps what the lock had)."""
    from ..verify.verdict import Failure

    if getattr(args, "sanitize", False):
        return {"sanitized": True}  # every candidate already ran under it
    if getattr(args, "no_sanitize", False):
        return {"sanitized": False}
    try:
        seconds = run()
    except Failure as failure:
        console.print(f"  [red]not locked[/]: compute-sanitizer found a problem in the chosen kernel "
                      f"({escape(failure.reason)}): {escape(failure.detail)}", soft_wrap=True)
        return None
    if seconds is None:
        console.print("  note: no compute-sanitizer here: locked without it (install the CUDA toolkit's "
                      "compute-sanitizer, or pass --no-sanitize to say so)")
        return {"sanitized": False}
    console.print("  compute-sanitizer: nothing found (" + ", ".join(f"{tool} {took:.0f} s" for tool, took
                                                                 in seconds.items()) + ")")
    return {"sanitized": True, "sanitize_s": seconds}


def _sanitize_source(spec, evaluator, candidate) -> dict | None:
    from ..verify.sanitize import sanitize_before_lock as run

    compiled = evaluator.compile(candidate)
    return run(spec, compiled.library) if compiled.ok else None


def verify_options(args) -> dict:
    """What the verifier is asked for besides its defaults: the sanitizer gate when --sanitize."""
    return {"sanitize": True} if getattr(args, "sanitize", False) else {}


def _baseline_timings(evaluator, baseline) -> dict | None:
    """Time the locked kernel once, so the prompt can name the time to beat."""
    compiled = evaluator.compile(baseline)
    if not compiled.ok:
        return None
    try:
        return evaluator.measure(baseline, compiled.library)
    except Exception:  # noqa: BLE001 - a baseline that cannot be timed is just not shown
        return None


def _outcome(attempt) -> str:
    from ..agents.prompts import format_timings

    if attempt.stage == "extract":
        return "[yellow]no usable code[/] in the answer"
    if attempt.stage == "compile":
        if attempt.ok:
            return "[green]compiled[/] (not verified: no GPU)"
        first = (attempt.details.get("diagnostics") or "").splitlines()
        return "[red]compile error[/]: " + escape(first[1] if len(first) > 1 else (first or [""])[0])
    if attempt.stage == "verify":
        return "[red]wrong[/]: " + escape((attempt.details.get("reason") or "").splitlines()[0][:200]
                                          if attempt.details.get("reason") else "")
    if attempt.stage == "measure":
        return "[yellow]correct, timing failed[/]: " + escape(attempt.details.get("reason", ""))
    slower = " [yellow](slower than eager)[/]" if attempt.details.get("slower_than_eager") else ""
    return "[green]correct[/]: " + escape(format_timings(attempt.details.get("timings"))) + slower
