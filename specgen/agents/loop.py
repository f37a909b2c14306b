"""The generate → compile → verify → measure → improve loop for one spec.

Each round asks the agent for `samples` candidates in parallel (threads; the same history,
so they differ only by sampling), then judges them in order. Every judgment becomes an
Attempt whose feedback text goes into the next prompt, and a transcript record. The loop
stops when a correct kernel reaches the target fraction of the memory roofline, or when
the budget (attempts, wall time, cost) is spent. The winner is the fastest candidate that
verified and is not slower than eager PyTorch (within the timing noise,
EAGER_NOISE_RATIO) over all benchmark rows nor on any one of them; a correct kernel clearly
slower than eager never wins (the package keeps the reference path rather than ship it).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import Rejected, SpecgenError
from .base import (EAGER_NOISE_RATIO, Agent, AgentExhausted, AgentRefused, Attempt, Candidate, KernelTask,
                   NoCandidate, Usage)
from .evaluate import Evaluator
from .prompts import feedback_text
from .transcript import Transcript


@dataclass
class Budget:
    attempts: int = 8  # candidates in total, code-less answers included
    samples: int = 1  # candidates per round, proposed in parallel
    wall_time_s: float | None = None
    cost_usd: float | None = None
    target_roofline: float | None = None  # stop once a correct kernel reaches this fraction


@dataclass
class LoopResult:
    winner: Candidate | None  # fastest verified candidate that beats eager; None if none
    winner_attempt: Attempt | None
    compiled: Candidate | None  # without a GPU: the first candidate that compiled (unverified)
    attempts: list[Attempt]
    usage: Usage
    stopped: str  # why the loop ended, in words
    verified: bool  # whether the evaluator could verify (a GPU was present)
    beats_baseline: bool | None = None  # None when there is no timed baseline
    notes: list[str] = field(default_factory=list)


def _proposal(agent: Agent, task: KernelTask, history: list[Attempt]) -> Candidate | Exception:
    try:
        return agent.propose(task, history)
    except (NoCandidate, AgentExhausted, SpecgenError) as outcome:  # AgentRefused is a SpecgenError
        return outcome


class Loop:
    def __init__(self, task: KernelTask, agent: Agent, evaluator: Evaluator, budget: Budget,
                 transcript: Transcript | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_attempt: Callable[[int, Attempt], None] | None = None):
        self.task = task
        self.agent = agent
        self.evaluator = evaluator
        self.budget = budget
        self.transcript = transcript or Transcript(None)
        self.clock = clock
        self.on_attempt = on_attempt  # progress display
        self.history: list[Attempt] = []
        self.usage = Usage()

    # ------------------------------------------------------------------ running
    def run(self) -> LoopResult:
        started = self.clock()
        self.transcript.write({"type": "start", "spec": self.task.spec.name,
                               "spec_hash": _spec_hash(self.task.spec), "agent": self.agent.name,
                               "model": self.agent.model, "budget": self.budget.__dict__,
                               "gpu": self.task.gpu, "can_verify": self.evaluator.can_verify,
                               "baseline_timings": self.task.baseline_timings})
        stopped = ""
        round_number = 0
        while not stopped:
            stopped = self._budget_spent(started)
            if stopped:
                break
            round_number += 1
            count = min(self.budget.samples, self.budget.attempts - len(self.history))
            snapshot = list(self.history)
            if count == 1:
                outcomes = [_proposal(self.agent, self.task, snapshot)]
            else:
                with ThreadPoolExecutor(max_workers=count) as pool:
                    outcomes = list(pool.map(lambda _: _proposal(self.agent, self.task, snapshot),
                                             range(count)))
            for outcome in outcomes:
                if isinstance(outcome, AgentRefused):
                    if not self.history:
                        raise outcome
                    stopped = f"the agent refused: {outcome}"
                    continue
                if isinstance(outcome, AgentExhausted):
                    stopped = str(outcome) or "the agent has nothing more to propose"
                    continue
                if isinstance(outcome, SpecgenError):
                    # A provider failing mid-run (server down, retries spent) ends the loop but
                    # keeps what earlier attempts found; failing before any attempt is an error.
                    if not self.history and not any(isinstance(o, (Candidate, NoCandidate)) for o in outcomes):
                        raise outcome
                    stopped = f"the agent failed: {outcome}"
                    continue
                attempt = self._judge(outcome, len(self.history) + 1)
                self._record(attempt, round_number)
                if self._reached_target(attempt):
                    stopped = (f"target reached: {attempt.details['timings']['roofline_fraction']:.0%} "
                               f"of the memory roofline")
            if not self.evaluator.can_verify and any(a.stage == "compile" and a.ok for a in self.history):
                stopped = "a candidate compiled; verifying it needs a GPU (none here)"
        return self._result(stopped)

    def _budget_spent(self, started: float) -> str:
        if len(self.history) >= self.budget.attempts:
            return f"all {self.budget.attempts} attempts used"
        if self.budget.wall_time_s is not None and self.clock() - started >= self.budget.wall_time_s:
            return f"wall time of {self.budget.wall_time_s:g} s spent"
        if self.budget.cost_usd is not None and self.usage.cost_usd >= self.budget.cost_usd:
            return f"cost budget of ${self.budget.cost_usd:g} spent (${self.usage.cost_usd:.4f})"
        return ""

    def _reached_target(self, attempt: Attempt) -> bool:
        fraction = (attempt.details.get("timings") or {}).get("roofline_fraction")
        return (self.budget.target_roofline is not None and _is_fast_path(attempt)
                and fraction is not None and fraction >= self.budget.target_roofline)

    # ------------------------------------------------------------------ judging
    def _judge(self, outcome: Candidate | NoCandidate, number: int) -> Attempt:
        started = time.perf_counter()
        if isinstance(outcome, NoCandidate):
            self.usage = self.usage + outcome.usage
            details = {"message": outcome.feedback, "response": outcome.log.get("response", ""),
                       "usage": outcome.usage, "model": outcome.model, "log": outcome.log}
            return Attempt(None, "extract", False,
                           feedback_text(number, "extract", False, message=outcome.feedback), details)
        candidate = outcome
        self.usage = self.usage + candidate.usage
        attempt = self._evaluate(candidate, number)
        attempt.details["seconds"] = round(time.perf_counter() - started, 3)
        return attempt

    def _evaluate(self, candidate: Candidate, number: int) -> Attempt:
        compiled = self.evaluator.compile(candidate)
        details: dict[str, Any] = {"compile_seconds": round(compiled.seconds, 3)}
        if not compiled.ok:
            details["diagnostics"] = compiled.diagnostics
            return Attempt(candidate, "compile", False,
                           feedback_text(number, "compile", False, diagnostics=compiled.diagnostics), details)
        if compiled.diagnostics:
            details["warnings"] = compiled.diagnostics
        if not self.evaluator.can_verify:
            message = "there is no GPU here, so it was not verified"
            return Attempt(candidate, "compile", True,
                           feedback_text(number, "compile", True, message=message), details)
        try:
            verdict = self.evaluator.verify(candidate, compiled.library)
        except Rejected as error:  # e.g. the verifier's worker crashed on this kernel
            verdict = None
            details.update(reason=str(error))
        if verdict is None or not verdict.passed:
            if verdict is not None:
                details.update(reason=verdict.reason, counterexample=verdict.counterexample,
                               report=verdict.report)
            return Attempt(candidate, "verify", False, feedback_text(
                number, "verify", False, reason=details.get("reason", ""),
                counterexample=details.get("counterexample"), report=details.get("report", "")), details)
        details["verdict_record"] = verdict.record
        try:
            timings = self.evaluator.measure(candidate, compiled.library)
        except Rejected as error:
            details["reason"] = str(error)
            return Attempt(candidate, "measure", False,
                           feedback_text(number, "measure", False, message=str(error)), details)
        kernel, eager = timings.get("kernel_us"), timings.get("eager_us")
        slower_rows = [row for row in timings.get("per_shape") or [] if isinstance(row, dict)
                       and slower_than_eager(row.get("kernel_us"), row.get("eager_us"))]
        slower = slower_than_eager(kernel, eager) or bool(slower_rows)  # over all rows, or on any one
        if slower_rows:
            details["slower_rows"] = [{k: row.get(k) for k in ("direction", "dtype", "dims", "kernel_us", "eager_us")}
                                      for row in slower_rows]
        details.update(timings=timings, slower_than_eager=slower,
                       score=kernel if kernel is not None else float("inf"))
        text = feedback_text(number, "done", True, timings=timings, slower_than_eager=slower,
                             target=self.budget.target_roofline, per_shape=timings.get("per_shape"))
        return Attempt(candidate, "done", True, text, details)

    def _record(self, attempt: Attempt, round_number: int) -> None:
        self.history.append(attempt)
        number = len(self.history)
        candidate = attempt.candidate
        details = {k: v for k, v in attempt.details.items() if k not in ("log", "response", "usage", "model")}
        log = candidate.log if candidate else attempt.details.get("log", {})
        usage = candidate.usage if candidate else attempt.details.get("usage", Usage())
        self.transcript.write({
            "type": "attempt", "number": number, "round": round_number,
            "agent": candidate.agent if candidate else self.agent.name,
            "model": (candidate.model if candidate else attempt.details.get("model")) or self.agent.model,
            "messages": log.get("messages"), "response": log.get("response"),
            "retries": log.get("retries"), "truncated": log.get("truncated"),
            "source": candidate.source if candidate else None, "notes": candidate.notes if candidate else "",
            "stage": attempt.stage, "ok": attempt.ok, "feedback": attempt.feedback, "details": details,
            "usage": usage, "total_usage": self.usage})
        if self.on_attempt:
            self.on_attempt(number, attempt)

    # ------------------------------------------------------------------ result
    def _result(self, stopped: str) -> LoopResult:
        fast = [a for a in self.history if _is_fast_path(a)]
        best = min(fast, key=lambda a: a.details["score"], default=None)
        compiled = next((a.candidate for a in self.history if a.stage == "compile" and a.ok), None)
        notes = []
        if best is None and any(a.stage == "done" for a in self.history):
            notes.append("every correct candidate was slower than eager PyTorch; "
                         "the package keeps the reference path for this op")
        beats_baseline = None
        baseline_us = (self.task.baseline_timings or {}).get("kernel_us")
        if best is not None and baseline_us is not None:
            beats_baseline = best.details["score"] < baseline_us
            if not beats_baseline:
                notes.append(f"the best candidate ({best.details['score']:.1f} us) does not beat the "
                             f"baseline ({baseline_us:.1f} us)")
        winner_number = self.history.index(best) + 1 if best else None
        self.transcript.write({"type": "end", "stopped": stopped, "winner": winner_number,
                               "usage": self.usage, "notes": notes})
        return LoopResult(winner=best.candidate if best else None, winner_attempt=best,
                          compiled=compiled, attempts=list(self.history), usage=self.usage,
                          stopped=stopped, verified=self.evaluator.can_verify,
                          beats_baseline=beats_baseline, notes=notes)


def slower_than_eager(kernel_us: float | None, eager_us: float | None) -> bool:
    """Clearly slower: eager / kernel below EAGER_NOISE_RATIO (unknown times are not slower)."""
    if kernel_us is None or eager_us is None or kernel_us <= 0:
        return False
    return eager_us / kernel_us < EAGER_NOISE_RATIO


def _is_fast_path(attempt: Attempt) -> bool:
    return attempt.stage == "done" and attempt.ok and not attempt.details.get("slower_than_eager")


def _spec_hash(spec) -> str | None:
    try:
        return spec.hash()
    except Exception:  # a test double without a hash
        return None


def run_loop(task: KernelTask, agent: Agent, evaluator: Evaluator, budget: Budget | None = None,
             transcript: Transcript | None = None, **kwargs) -> LoopResult:
    return Loop(task, agent, evaluator, budget or Budget(), transcript, **kwargs).run()
