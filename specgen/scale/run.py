"""How `specgen build|generate --gpus ...|--scheduler ...` split their work (docs/SCALE.md).

- The references: one CPU task per spec (the sandbox run `specgen check` does), at once.
- Each spec: one GPU task (tasks.build_spec_task / generate_spec_task; the longest guessed
  first, so no GPU waits on one long spec at the end) that runs the one-GPU
  code path for that spec in a scratch copy of its folder, on one GPU worker: reuse,
  re-verification of a hand-edited kernel, the LLM loop (its --samples candidates proposed
  concurrently, the provider SDK's own connection pool), or the builtin tuner's variants,
  with the compile cache shared by content hash. Specs are taken in order by whichever GPU
  is free, so N GPUs run N specs at once.
- The client adopts each task's lock entry and kernel into the real lock as the task ends
  (tasks.adopt: atomic, the only writer), then the rest of the build (the symbol gate, the
  package, the wheel) runs here as in the one-GPU path.
"""
from __future__ import annotations

import atexit
import os
import tempfile
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, wait

from rich.console import Console

from . import WorkerLost, make_executor
from .budget import DaskLedger, FileLedger, Ledger
from .progress import BuildProgress
from .tasks import (adopt, build_spec_task, generate_spec_task, reference_check_task, spec_payload,
                    task_options)


class Session:
    """One scaled command: its executor, the build-wide budget ledger, the progress display."""

    def __init__(self, args, console: Console, executor=None):
        self.args, self.console = args, console
        self.started = time.time()
        self.executor = executor or make_executor(args)
        self._ledger_file: str | None = None
        self.ledger = self._make_ledger()
        self._closed = False
        atexit.register(self.close)
        where = ", ".join(self.executor.slots) or "no GPU worker yet"
        console.print(f"scale-out: {self.executor.name} backend, GPU workers: {where}")

    def _make_ledger(self) -> Ledger | None:
        budget, wall = getattr(self.args, "budget_usd", None), getattr(self.args, "wall_time", None)
        if budget is None and wall is None:
            return None
        deadline = self.started + wall if wall is not None else None
        if self.executor.name == "dask" and getattr(self.args, "scheduler", None):
            return DaskLedger(f"specgen-budget-{uuid.uuid4().hex[:12]}", budget, deadline)
        fd, path = tempfile.mkstemp(prefix="specgen-budget-", suffix=".json")
        os.close(fd)
        self._ledger_file = path
        return FileLedger(path, budget, deadline)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.executor.close()
        if self._ledger_file:
            try:
                os.unlink(self._ledger_file)
            except OSError:
                pass

    # ------------------------------------------------------------------ the work
    def check_references(self, specs) -> None:
        """Every spec's reference in the sandbox, as CPU tasks at once; the first failure in
        spec order is raised (as the one-GPU path would)."""
        futures = [self.executor.submit(reference_check_task, spec_payload(s), gpu=False,
                                        label=f"{s.name} (reference)") for s in specs]
        wait(futures)
        for future in futures:
            future.result()

    def _run_specs(self, specs, task, on_result):
        """One GPU task per spec; `on_result(spec, result)` in the client as each ends. A task's
        own error stops the submission of the rest and is raised once the running ones end
        (the first in spec order); a worker lost twice is reported for its spec only."""
        options = task_options(self.args)
        pending = {}
        errors = {}
        try:
            with BuildProgress(self.console, self.executor, len(specs)) as progress:
                for spec in sorted(specs, key=_weight, reverse=True):  # the longest first
                    future = self.executor.submit(task, spec_payload(spec), options, self.ledger, gpu=True,
                                                  label=spec.name)
                    pending[future] = spec
                while pending:
                    done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                    for future in done:
                        spec = pending.pop(future)
                        if future.cancelled():
                            continue
                        error = future.exception()
                        if isinstance(error, WorkerLost):
                            on_result(spec, None, error)
                            progress.finished(spec.name, "-", 0.0, "lost")
                        elif error is not None:
                            errors[spec.name] = error
                            for other in pending:
                                self.executor.cancel(other)
                        else:
                            result = future.result()
                            on_result(spec, result, None)
                            progress.finished(spec.name, result.get("slot") or "?", result.get("seconds", 0.0),
                                              result.get("action") or _code_word(result.get("code")))
        finally:
            self.close()
        for spec in specs:
            if spec.name in errors:
                raise errors[spec.name]

    def resolve_build(self, specs) -> list:
        """`specgen build`'s per-op results, from the GPU workers; the lock adopted here."""
        from ..commands.build import OpResult

        results = {}

        def on_result(spec, result, lost):
            if lost is not None:
                results[spec.name] = OpResult(spec, problem=f"{spec.name}: {lost}")
                return
            adopt(spec, result)
            results[spec.name] = OpResult(spec, result["kernel"], result["provenance"], result["problem"],
                                          result["action"])

        self._run_specs(specs, build_spec_task, on_result)
        return [results[s.name] for s in specs]

    def generate(self, specs) -> tuple[int, list[dict]]:
        """`specgen generate`'s exit code and per-spec outcomes."""
        from ..commands.generate import spec_outcome
        from ..errors import EXIT_OK, EXIT_REJECTED

        codes = {}

        def on_result(spec, result, lost):
            if lost is not None:
                self.console.print(f"  {spec.name}: {lost}")
                codes[spec.name] = EXIT_REJECTED
                return
            adopt(spec, result)
            codes[spec.name] = result["code"]

        self._run_specs(specs, generate_spec_task, on_result)
        code, outcomes = EXIT_OK, []
        for spec in specs:
            result = codes.get(spec.name, EXIT_REJECTED)
            outcome = spec_outcome(spec)
            if not outcome["verified"]:
                result = max(result, EXIT_REJECTED)
                self.console.print(f"  {spec.name} has no verified kernel ({outcome['state']}): exit 1")
            outcomes.append({**outcome, "exit_code": result})
            code = max(code, result)
        return code, outcomes


def _weight(spec) -> int:
    """A rough guess of a spec's GPU time, to start the longest first (fewer idle GPUs at the
    end): a fresh lock entry ~ nothing, else benchmark rows x dtypes x directions. The order
    changes when each spec runs, never what it gives."""
    try:
        from ..lock import FRESH, status

        if status(spec).state == FRESH:
            return 0
        directions = 2 if spec.backward == "kernel" else 1
        return max(1, len(spec.benchmark)) * len(spec.dtypes) * directions
    except Exception:  # noqa: BLE001 - only an order
        return 1


def _code_word(code) -> str:
    return {0: "done", 1: "no verified kernel"}.get(code, f"exit {code}")
