"""`specgen draft`'s loop: one sentence -> an LLM writes a spec -> `specgen check` -> its error
back to the model -> ... until a draft passes (or the attempts run out).

The model's answer is one ```yaml block; each draft is checked in a scratch folder (never
where the user's specs live), and only a passing draft is returned, for the command to write
as a file the user reviews. Every exchange goes to a JSONL transcript.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from .agents.base import Usage
from .agents.extract import fenced_blocks
from .agents.prompts import render

YAML_LANGUAGES = {"yaml", "yml"}
DEFAULT_ATTEMPTS = 4


@dataclass
class DraftAttempt:
    number: int
    text: str | None  # the YAML drafted; None: no spec in the answer
    problem: str | None  # what `specgen check` (or the extraction) said; None: it passed


@dataclass
class DraftResult:
    text: str | None  # the passing spec's YAML; None when no draft passed
    name: str | None
    attempts: list[DraftAttempt] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)

    @property
    def passed(self) -> bool:
        return self.text is not None

    def as_json(self) -> dict:
        return {"passed": self.passed, "name": self.name, "attempts": [a.__dict__ for a in self.attempts],
                "usage": self.usage.__dict__}


def extract_spec(text: str) -> str | None:
    """The spec YAML of an answer: a ```yaml block, else any block (or the whole answer)
    that reads as a mapping with a signature."""
    blocks = fenced_blocks(text)
    ordered = [b for b in blocks if b.language in YAML_LANGUAGES] + [b for b in blocks
                                                                     if b.language not in YAML_LANGUAGES]
    for candidate in [b.code for b in reversed(ordered)] + ([text] if not blocks else []):
        try:
            data = yaml.safe_load(candidate)
        except yaml.YAMLError:
            if any(b.code == candidate and b.language in YAML_LANGUAGES for b in blocks):
                return candidate  # a yaml block with a syntax error: let check say where
            continue
        if isinstance(data, dict) and ("signature" in data or "name" in data):
            return candidate.strip("\n") + "\n"
    return None


def check_draft(text: str, name: str | None) -> tuple[str | None, str | None]:
    """(problem, op name): `specgen check` on the draft in a scratch folder."""
    from .checking import check_spec

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    drafted = data.get("name") if isinstance(data, dict) and isinstance(data.get("name"), str) else None
    stem = name or (drafted if drafted and drafted.isidentifier() else "draft")
    with tempfile.TemporaryDirectory(prefix="specgen-draft-") as folder:
        path = Path(folder) / f"{stem}.yaml"
        path.write_text(text, encoding="utf-8")
        result = check_spec(path)
        if not result.ok:
            return str(result.error).replace(str(path), path.name), drafted
    if name and drafted != name:
        return f"the op is named {drafted!r}; name it {name!r} (in `name:` and in the signature)", drafted
    return None, drafted


def draft_spec(sentence: str, agent, *, name: str | None = None, attempts: int = DEFAULT_ATTEMPTS,
               transcript=None, on_attempt: Callable[[DraftAttempt], None] | None = None) -> DraftResult:
    """Ask `agent` (an LLMAgent) for a spec until one passes `specgen check`, at most `attempts` times."""
    messages = [{"role": "system", "content": render("draft_system.j2")},
                {"role": "user", "content": render("draft_task.j2", sentence=sentence, op_name=name)}]
    result = DraftResult(None, None)
    if transcript is not None:
        transcript.write({"type": "start", "kind": "draft", "sentence": sentence, "agent": agent.name,
                          "model": agent.model, "name": name})
    for number in range(1, attempts + 1):
        reply = agent.send(messages)
        result.usage = result.usage + agent.cost(reply)
        text = extract_spec(reply.text)
        if text is None:
            problem = ("your answer has no spec: reply with the complete spec in one ```yaml block"
                       + (" (the answer was cut off by the token limit: write less prose)" if reply.truncated else ""))
            drafted = None
        else:
            problem, drafted = check_draft(text, name)
        attempt = DraftAttempt(number, text, problem)
        result.attempts.append(attempt)
        if transcript is not None:
            transcript.write({"type": "attempt", "number": number, "messages": messages, "response": reply.text,
                              "spec": text, "problem": problem, "input_tokens": reply.input_tokens,
                              "output_tokens": reply.output_tokens})
        if on_attempt is not None:
            on_attempt(attempt)
        if problem is None:
            result.text, result.name = text, drafted
            break
        messages = messages + [{"role": "assistant", "content": reply.text},
                               {"role": "user", "content": render("draft_feedback.j2", number=number,
                                                                  problem=_for_model(problem))}]
    if transcript is not None:
        transcript.write({"type": "end", "passed": result.passed, "attempts": len(result.attempts),
                          "usage": result.usage.__dict__})
    return result


def _for_model(problem: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", problem)
