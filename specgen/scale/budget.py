"""--budget-usd and --wall-time across a whole scaled build: one ledger every worker shares.

In the one-GPU path both bound each spec's loop (agents/loop.py Budget). With --gpus or
--scheduler the specs' loops run at once in several workers, so the same two numbers also
bound the whole build: every worker's LLM agent is wrapped (BudgetedAgent) so that it
proposes nothing once the ledger's cost reaches --budget-usd or its deadline (the client's
start + --wall-time) has passed, and adds each answer's cost to the ledger. Requests already
in flight when the limit is reached still finish (as in one round of --samples today), so
the build can end past the budget by at most the requests then running.

Ledgers: FileLedger (a JSON file under an flock: the workers of one host, the local backend
and a local Dask cluster) and DaskLedger (a Dask Variable under a Dask Lock: any cluster).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from ..agents.base import Agent, AgentExhausted, NoCandidate

_active = None  # the scaled task running in this process: {"ledger", "samples", "arch"} (None: one-GPU path)


class Ledger:
    budget_usd: float | None = None
    deadline: float | None = None  # time.time() after which nothing more is proposed

    def add(self, cost_usd: float) -> float:
        raise NotImplementedError

    def spent(self) -> float:
        raise NotImplementedError

    def exhausted(self) -> str:
        """Why the build's budget is spent ("" while it is not)."""
        if self.deadline is not None and time.time() >= self.deadline:
            return "the build's wall time (--wall-time, across every spec) is spent"
        if self.budget_usd is not None:
            spent = self.spent()
            if spent >= self.budget_usd:
                return (f"the build's cost budget of ${self.budget_usd:g} (--budget-usd, across every spec) "
                        f"is spent (${spent:.4f})")
        return ""


class FileLedger(Ledger):
    def __init__(self, path: str | Path, budget_usd: float | None = None, deadline: float | None = None):
        self.path, self.budget_usd, self.deadline = str(path), budget_usd, deadline

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _read(self, fd) -> float:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode() or "{}"
        try:
            return float(json.loads(text).get("cost_usd", 0.0))
        except (ValueError, AttributeError):
            return 0.0

    def add(self, cost_usd: float) -> float:
        with self._locked() as fd:
            total = self._read(fd) + float(cost_usd or 0.0)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps({"cost_usd": total}).encode())
            return total

    def spent(self) -> float:
        with self._locked() as fd:
            return self._read(fd)


class DaskLedger(Ledger):
    """The same on a Dask cluster: the total in a distributed Variable, added under a Lock."""

    def __init__(self, name: str, budget_usd: float | None = None, deadline: float | None = None):
        self.name, self.budget_usd, self.deadline = name, budget_usd, deadline

    def _parts(self):
        from distributed import Lock, Variable

        return Lock(f"{self.name}-lock"), Variable(self.name)

    def _get(self, variable) -> float:
        try:
            return float(variable.get(timeout=0.5))
        except Exception:  # noqa: BLE001 - not set yet
            return 0.0

    def add(self, cost_usd: float) -> float:
        lock, variable = self._parts()
        with lock:
            total = self._get(variable) + float(cost_usd or 0.0)
            variable.set(total)
            return total

    def spent(self) -> float:
        return self._get(self._parts()[1])


class BudgetedAgent(Agent):
    """An agent that stops proposing once the build's ledger says so, and pays into it."""

    def __init__(self, agent: Agent, ledger: Ledger):
        self.inner, self.ledger = agent, ledger
        self.name, self.model = agent.name, agent.model

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def propose(self, task, history):
        why = self.ledger.exhausted()
        if why:
            raise AgentExhausted(why)
        try:
            candidate = self.inner.propose(task, history)
        except NoCandidate as answer:
            self.ledger.add(answer.usage.cost_usd)
            raise
        self.ledger.add(getattr(getattr(candidate, "usage", None), "cost_usd", 0.0) or 0.0)
        return candidate


class PrecompilingAgent(Agent):
    """With --samples N the loop asks for N candidates at once (N threads), then judges them
    one after another. This wrapper compiles each candidate in its own thread as soon as it
    arrives, so N nvcc run at once and the loop's compile of each is a lookup in the
    content-hashed compile cache (same source, header, flags and arch: the same key)."""

    def __init__(self, agent: Agent, arch: str | None):
        self.inner, self.arch = agent, arch
        self.name, self.model = agent.name, agent.model

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def propose(self, task, history):
        candidate = self.inner.propose(task, history)
        try:
            import tempfile

            from ..toolchain import compile_kernel

            with tempfile.TemporaryDirectory(prefix="specgen-abi-") as include:
                (Path(include) / task.header_name).write_text(task.header)
                compile_kernel(candidate.source, include_dirs=[Path(include)], arch=self.arch,
                               name=task.spec.name, source_name=f"{task.spec.name}.cu")
        except Exception:  # noqa: BLE001 - the loop's own compile reports what went wrong
            pass
        return candidate


def wrap_agent(agent: Agent) -> Agent:
    """The agent as a scaled task runs it: bounded by the build's ledger, and compiling its
    concurrent samples at once (itself in the one-GPU path, and for builtin and replay)."""
    if _active is None or agent.name in ("builtin", "replay"):
        return agent
    if (_active.get("samples") or 1) > 1:
        agent = PrecompilingAgent(agent, _active.get("arch"))
    if _active.get("ledger") is not None:
        agent = BudgetedAgent(agent, _active["ledger"])
    return agent


@contextlib.contextmanager
def active(ledger: Ledger | None, *, samples: int = 1, arch: str | None = None):
    """The scope of one scaled task in a worker (tasks.py enters it)."""
    global _active
    previous, _active = _active, {"ledger": ledger, "samples": samples, "arch": arch}
    try:
        yield
    finally:
        _active = previous
