"""`specgen draft "SENTENCE" --agent openai -o specs/NAME.yaml`: an LLM writes a spec.

The draft is checked with `specgen check`, its errors go back to the model until one passes
(at most --attempts), and the passing spec is written atomically for the user to review: it
is never built here, and an existing file is never overwritten without --force. The
offline builtin agent writes kernels, not specs: it exits 3 and names the LLM agents.
"""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from ..errors import EXIT_OK, EnvironmentMissing, Rejected, UsageError

LLM_AGENTS = ("openai", "anthropic", "openai-compatible")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "draft", help="an LLM agent drafts a spec from one sentence (checked, for you to review)",
        description="Ask an LLM agent for a spec (description, signature, dims, dtypes, reference, tolerance, "
                    "benchmark shapes) from SENTENCE; `specgen check` runs on each draft and its errors go back to "
                    "the agent until one passes. The spec is written for you to review; nothing is built.")
    p.add_argument("sentence", metavar="SENTENCE", help='what the op computes, e.g. "RMSNorm with a learned scale"')
    p.add_argument("-o", "--out", default="specs", metavar="FILE_OR_DIR",
                   help="specs/NAME.yaml (the op is named NAME), or a folder (the agent names it; default specs/)")
    p.add_argument("--agent", default="builtin", help="openai, anthropic or openai-compatible (an LLM is needed)")
    p.add_argument("--model", default=None, help="model name (default: per agent, see models.toml)")
    p.add_argument("--base-url", default=None, metavar="URL", help="server URL (openai-compatible)")
    p.add_argument("--api-key-env", default=None, metavar="VAR", help="environment variable holding the API key")
    p.add_argument("--attempts", type=int, default=4, help="drafts at most (default 4)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per LLM request (default 300)")
    p.add_argument("--retries", type=int, default=4, help="per LLM request on 429/5xx/timeouts (default 4)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--transcript-dir", default=".specgen/transcripts", metavar="DIR",
                   help="where the JSONL transcript goes (default .specgen/transcripts)")
    p.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON to OUT ('-': stdout)")
    p.set_defaults(func=run)


def _agent(args):
    from ..agents.llm import LLMAgent
    from ..agents.registry import AgentOptions, agent_class, create_agent, load_catalog

    if not issubclass(agent_class(args.agent), LLMAgent):
        raise EnvironmentMissing(f"specgen draft needs an LLM agent to write a spec from a sentence; --agent "
                                 f"{args.agent} cannot (it writes kernels from specs). Use --agent "
                                 f"{' | '.join(LLM_AGENTS)}, or start from `specgen init NAME` or `specgen import`")
    options = AgentOptions(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env,
                           timeout_s=args.timeout, max_retries=args.retries, temperature=args.temperature,
                           catalog=load_catalog())
    return create_agent(args.agent, options)


def run(args) -> int:
    from ..agents.transcript import Transcript, default_path
    from ..drafting import draft_spec
    from ..fsutil import write_atomic
    from ..ui import Progress, emit_json, human_console

    if args.attempts < 1:
        raise UsageError(f"--attempts {args.attempts}: give at least 1")
    if not args.sentence.strip():
        raise UsageError("SENTENCE is empty: say what the op computes")
    out = Path(args.out)
    file_given = out.suffix in (".yaml", ".yml")
    name = out.stem if file_given else None
    if name is not None and not name.isidentifier():
        raise UsageError(f"-o {out}: the file name is the op name, so it must be an identifier (e.g. my_op.yaml)")
    if file_given and out.exists() and not args.force:
        raise UsageError(f"{out} exists already; pass --force to overwrite it, or -o another path")
    agent = _agent(args)
    human = human_console(args.json)
    progress = Progress()
    transcript_path = default_path(Path(args.transcript_dir), f"draft-{name or 'spec'}")

    def show(attempt):
        verdict = "[green]passes specgen check[/]" if attempt.problem is None else \
            "[red]rejected[/]: " + escape(attempt.problem.splitlines()[0][:300])
        human.print(f"  draft {attempt.number}: {verdict}", soft_wrap=True)

    with progress.stage(f"drafting a spec with {agent.name} ({agent.model})", done=False):
        result = draft_spec(args.sentence, agent, name=name, attempts=args.attempts,
                            transcript=Transcript(transcript_path), on_attempt=show)
    usage = result.usage
    summary = {**result.as_json(), "path": None, "transcript": str(transcript_path)}
    if not result.passed:
        emit_json(args.json, summary)
        last = result.attempts[-1].problem if result.attempts else "no answer"
        raise Rejected(f"no draft passed `specgen check` in {len(result.attempts)} attempt(s); nothing was written. "
                       f"Last problem:\n  {last}\n  (transcript: {transcript_path})")
    path = out if file_given else out / f"{result.name}.yaml"
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists already; pass --force to overwrite it, or -o another path")
    header = (f"# Drafted by `specgen draft` ({agent.name}, {agent.model}) from: {' '.join(args.sentence.split())}\n"
              f"# Review it (the reference above all) before `specgen build`; it passed `specgen check`.\n")
    write_atomic(path, header + result.text)
    summary["path"] = str(path)
    human.print(f"[green]wrote[/] {escape(str(path))} (draft {len(result.attempts)}; "
                f"{usage.input_tokens}+{usage.output_tokens} tokens, ${usage.cost_usd:.4f})", soft_wrap=True)
    human.print(f"next: review {escape(str(path))}, then `specgen build {escape(str(path.parent))}`", soft_wrap=True)
    emit_json(args.json, summary)
    return EXIT_OK
