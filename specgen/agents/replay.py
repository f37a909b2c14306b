"""`--agent replay --transcript FILE`: rerun a transcript's candidates in order, offline.

Each proposal is the next attempt of the transcript (its source, or its code-less answer);
the loop compiles, verifies and measures them again on this machine.
"""
from __future__ import annotations

import threading
from pathlib import Path

from ..errors import UsageError
from .base import Agent, AgentExhausted, Attempt, Candidate, KernelTask, NoCandidate
from .registry import AgentOptions
from .transcript import read_records


class ReplayAgent(Agent):
    name = "replay"

    def __init__(self, transcript: Path):
        self.transcript = Path(transcript)
        self.records = [r for r in read_records(self.transcript) if r.get("type") == "attempt"]
        start = next((r for r in read_records(self.transcript) if r.get("type") == "start"), {})
        self.model = start.get("model")
        self.spec_name = start.get("spec")
        self._next = 0
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, options: AgentOptions) -> "ReplayAgent":
        if not options.transcript:
            raise UsageError("--agent replay needs --transcript FILE (a .jsonl from an earlier run)")
        return cls(options.transcript)

    def propose(self, task: KernelTask, history: list[Attempt]) -> Candidate:
        if self.spec_name and self.spec_name != task.spec.name:
            raise UsageError(f"--transcript {self.transcript} is for spec {self.spec_name!r}, "
                             f"not {task.spec.name!r}")
        with self._lock:
            if self._next >= len(self.records):
                raise AgentExhausted(f"all {len(self.records)} attempts of {self.transcript} replayed")
            record = self.records[self._next]
            self._next += 1
        note = f"replay of attempt {record.get('number')} from {self.transcript.name}"
        if not record.get("source"):
            raise NoCandidate((record.get("details") or {}).get("message") or "no code in the replayed answer",
                              model=record.get("model"), log={"replayed": record.get("number")})
        return Candidate(source=record["source"], agent=record.get("agent") or self.name,
                         model=record.get("model"), notes=note,
                         log={"replayed": record.get("number")})
