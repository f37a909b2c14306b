"""Checks on tensor values that only raise, answered while tracing.

A reference may test its inputs' values and raise when they are invalid: F.gaussian_nll_loss
runs `if torch.any(var < 0): raise ValueError(...)`, user code writes `assert (x >= 0).all()`.
A symbolic trace cannot evaluate that truth (the value is data), so make_fx stops. Such a test
defines no value on the raising side: the kernel computes the other side, as the reference does
for every input it returns a value for. `traced_with_value_guards` answers each truth test of a
traced 0-d bool tensor (False first, the order the tests come in), backtracks when an answer
leads to a raise, and then checks that every answer it kept is a guard: the opposite answer must
raise whatever the later tests are answered (an `assert` inside a branch does not make the branch
a check). A test whose both sides can return values is control flow on data: refused, never guessed.
"""
from __future__ import annotations

import contextlib
import traceback

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..base import AgentRefused

GUARD_RAISES = (ValueError, AssertionError)  # what a reference's own check raises
MAX_TRACES = 24


class _Answers:
    """Answer the traced truth tests in order from `given`, False past its end; count the asks."""

    def __init__(self, given: list[bool], filename: str):
        self.given = list(given)
        self.filename = filename
        self.used: list[bool] = []
        self.lines: list[int | None] = []  # the reference's line of each truth test

    def answer(self) -> bool:
        value = self.given[len(self.used)] if len(self.used) < len(self.given) else False
        self.used.append(value)
        lines = [f.lineno for f in traceback.extract_stack() if f.filename == self.filename]
        self.lines.append(lines[-1] if lines else None)
        return value


@contextlib.contextmanager
def _answering(answers: _Answers):
    original = torch.Tensor.__bool__

    def truth(t):
        if isinstance(t, FakeTensor) and t.dtype == torch.bool and t.numel() == 1:
            return answers.answer()
        return original(t)

    torch.Tensor.__bool__ = truth
    try:
        yield
    finally:
        torch.Tensor.__bool__ = original


def _run(trace_once, given: list[bool], filename: str):
    """(graph or the guard's exception, the answers with their lines)."""
    answers = _Answers(given, filename)
    try:
        with _answering(answers):
            return trace_once(), answers
    except GUARD_RAISES:
        if not answers.used:
            raise  # a raise no truth test of ours led to: the reference's own failure
        return None, answers


class _Budget:
    def __init__(self, traces: int, filename: str):
        self.left = traces
        self.filename = filename

    def spend(self) -> None:
        if self.left <= 0:
            raise AgentRefused(f"{self.filename}: more than {MAX_TRACES} traces to pass the reference's checks on "
                               f"tensor values; use an LLM agent (--agent openai|anthropic|openai-compatible)")
        self.left -= 1


def _search(trace_once, prefix: list[bool], filename: str, budget: _Budget):
    """(graph, answers) of the first answers after `prefix` (False first, depth first) whose trace
    returns, or None when every continuation raises a check's exception."""
    given = list(prefix)
    while True:
        budget.spend()
        graph, answers = _run(trace_once, given, filename)
        if graph is not None:
            return graph, answers
        used = list(answers.used)
        while len(used) > len(prefix) and used[-1]:  # every answer after the last False was tried both ways
            used.pop()
        if len(used) <= len(prefix):
            return None
        given = used[:-1] + [True]


def traced_with_value_guards(trace_once, filename: str):
    """`trace_once()`'s graph with the reference's value checks assumed to pass, and the
    answers given; AgentRefused naming the line of a truth test that is not such a check: one
    whose other answer leads, by some answers to the tests after it, to a result too."""
    budget = _Budget(MAX_TRACES, filename)
    found = _search(trace_once, [], filename, budget)
    if found is None:
        return trace_once()  # no answers pass every check: the reference's own failure, raised
    graph, answers = found
    for i, kept in enumerate(answers.used):
        if _search(trace_once, answers.used[:i] + [not kept], filename, budget) is not None:
            line = answers.lines[i]
            raise AgentRefused(f"{filename}{f':{line}' if line else ''}: the reference branches on tensor values "
                               f"(a truth test whose both sides compute a result): outside the builtin generator's "
                               f"families; use an LLM agent (--agent openai|anthropic|openai-compatible)")
    return graph, answers.used
