"""The verification itself, run inside the worker process (it needs the GPU): per direction,
a smoke case, stream discipline, the boundary cases, Hypothesis cases (shrunk on failure),
bit-identical repeats on a large case, and the re-check after timing."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch
from hypothesis import HealthCheck, Phase, Verbosity, assume, given, settings
from hypothesis import seed as hypothesis_seed

from . import DEFAULT_EXAMPLES  # Hypothesis cases per direction, on top of the boundary cases
from .checks import check_after_timing, check_case, check_deterministic_repeats, check_stream_discipline
from .data import CaseData, prepare
from .runner import KernelLibrary, load_library
from .strategies import DEFAULT_BUDGET_ELEMENTS, Case, boundary_cases, case_strategy, large_case, smoke_case
from .verdict import CRASH, PASSED, Failure, Verdict

SHRINK_SECONDS = 20.0  # stop shrinking a counterexample after this long


@dataclass
class Options:
    examples: int = DEFAULT_EXAMPLES
    seed: int = 0
    budget: int = DEFAULT_BUDGET_ELEMENTS
    directions: tuple[str, ...] | None = None  # default: forward, and backward when the spec has a kernel
    quick: bool = False  # the small run for compute-sanitizer: smoke + a few boundary cases, no timing


Progress = Callable[[str], None]


class Session:
    """The checks of one candidate, with the bookkeeping the verdict reports."""

    def __init__(self, spec, lib: KernelLibrary, options: Options, progress: Progress, device: str = "cuda"):
        self.spec, self.lib, self.options, self.progress = spec, lib, options, progress
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream() if self.device.type == "cuda" else None
        self.cases = 0
        self.tolerances: dict[str, dict] = {}

    def prepare(self, case: Case, direction: str) -> CaseData:
        self.progress(f"{direction}: {case.describe()}")
        data = prepare(self.spec, case, direction, self.device)
        key = f"{direction} {case.dtype}"
        entry = self.tolerances.setdefault(key, {"spec_atol": data.spec_atol, "spec_rtol": data.rtol,
                                                 "max_atol_used": data.spec_atol})
        entry["max_atol_used"] = max([entry["max_atol_used"], *data.atol.values()])
        return data

    def run_case(self, case: Case, direction: str) -> dict:
        data = self.prepare(case, direction)
        self.cases += 1
        try:
            return check_case(self.lib, data, self.stream, deterministic=self.spec.deterministic)
        except RuntimeError as error:  # torch.AcceleratorError included: torch failed after the kernel ran
            if "cuda" not in str(error).lower():
                raise  # not the GPU: a harness problem, reported as such
            raise Failure(CRASH, f"after {direction} on {case.describe()}: {str(error).strip().splitlines()[0]}",
                          fatal=True) from None

    def direction(self, direction: str) -> None:
        spec, opts = self.spec, self.options
        smoke = smoke_case(spec, opts.seed)
        first = self.run_case(smoke, direction)
        if not opts.quick and self.device.type == "cuda":
            self.progress(f"{direction}: stream discipline")
            check_stream_discipline(self.lib, self.prepare(smoke, direction), first,
                                    deterministic=spec.deterministic)
        boundary = boundary_cases(spec, opts.budget, opts.seed)
        for case in (boundary[:4] if opts.quick else boundary):
            self.run_case(case, direction)
        if opts.quick:
            return
        self.hypothesis(direction)
        big = large_case(spec, opts.budget, opts.seed + 7)
        data = self.prepare(big, direction)
        self.cases += 1
        out = check_case(self.lib, data, self.stream, deterministic=spec.deterministic)
        if spec.deterministic:
            self.progress(f"{direction}: repeated runs on {big.describe()}")
            check_deterministic_repeats(self.lib, data, self.stream, out)
        self.progress(f"{direction}: re-check after timing")
        fresh = self.prepare(dataclasses.replace(big, seed=big.seed + 1000, distribution="uniform"), direction)
        check_after_timing(self.lib, data, fresh, self.stream)

    def hypothesis(self, direction: str) -> None:
        """Hypothesis cases; a failure is shrunk (within SHRINK_SECONDS) to a small counterexample."""
        if self.options.examples <= 0:
            return
        seen: dict[Case, Failure | None] = {}
        fatal: list[Failure] = []
        found_at: list[float] = []

        @settings(max_examples=self.options.examples, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False,
                  phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False)
        @hypothesis_seed(self.options.seed)
        @given(case_strategy(self.spec, self.options.budget))
        def property_(case: Case) -> None:
            if case in seen:
                if seen[case] is not None:
                    raise seen[case]
                return
            if fatal or (found_at and time.monotonic() - found_at[0] > SHRINK_SECONDS):
                assume(False)  # stop exploring: keep the smallest failure found so far
            try:
                self.run_case(case, direction)
            except Failure as failure:
                seen[case] = failure
                if failure.fatal:
                    fatal.append(failure)
                found_at.append(time.monotonic())
                raise
            seen[case] = None

        try:
            property_()
        except Failure as failure:
            raise (fatal[0] if fatal else failure) from None
        except BaseException:
            if fatal:
                raise fatal[0] from None
            failures = [f for f in seen.values() if f is not None]
            if failures:  # Hypothesis gave up in its own way (flaky replay...): report what was found
                raise failures[-1] from None
            raise


def run_verification(spec, library, options: Options, progress: Progress = lambda text: None,
                     device: str = "cuda") -> Verdict:
    """The verdict of one compiled candidate. Raises only for harness problems (e.g. a broken
    reference); everything the kernel does wrong becomes the verdict."""
    started = time.perf_counter()
    session = Session(spec, load_library(spec, library), options, progress, device)
    directions = options.directions or (("forward", "backward") if spec.backward == "kernel" else ("forward",))
    try:
        for direction in directions:
            session.direction(direction)
        verdict = Verdict(PASSED, f"{session.cases} cases over {', '.join(directions)} passed every check")
    except Failure as failure:
        verdict = Verdict.from_failure(failure)
    except RuntimeError as error:  # torch noticed the GPU is broken after the kernel ran
        if "cuda" not in str(error).lower():
            raise
        verdict = Verdict(CRASH, f"the GPU failed after the kernel ran: {str(error).strip().splitlines()[0]}",
                          fatal=True)
    verdict.cases = session.cases
    verdict.tolerances = session.tolerances
    verdict.timings["verify_s"] = round(time.perf_counter() - started, 3)
    return verdict
