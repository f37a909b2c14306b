"""A deterministic tuning backend for CPU tests (agents/builtin/tune.py's TuneBackend): the
verifier and the timer are plain functions of the variant name and the benchmark row, and
every call advances a fake clock by a fixed cost, so the budget is exercised without a GPU."""
from __future__ import annotations

import re

from specgen.agents.builtin.tune import Check, TuneBackend, directions


def variant_of(source: str) -> str:
    return re.search(r"// Schedule variant: (\S+)\.", source).group(1)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBackend(TuneBackend):
    """kernel_us(variant, row) and eager_us(row) give the times; `failing` variants fail
    verification; each verify / timing costs `cost` seconds of the fake clock."""

    def __init__(self, *, kernel_us=None, eager_us=None, failing=(), cost: float = 10.0, arch: str = "sm_90",
                 clock: FakeClock | None = None):
        self.arch = arch
        self.kernel_us = kernel_us or (lambda variant, row: 100.0)
        self.eager_us = eager_us or (lambda row: 200.0)
        self.failing = set(failing)
        self.cost = cost
        self.clock = clock or FakeClock()
        self.calls: list[tuple[str, str]] = []

    def _rows(self, spec):
        return [{"direction": d, "dtype": dtype, "dims": dict(dims)}
                for dims in spec.benchmark for dtype in spec.dtypes for d in directions(spec)]

    def prepare(self, spec, sources):
        self.calls.append(("prepare", str(len(sources))))

    def verify(self, spec, source):
        name = variant_of(source)
        self.calls.append(("verify", name))
        self.clock.now += self.cost / 2
        if name in self.failing:
            return Check(False, f"wrong_output: variant {name} differs at [0, 3]")
        return Check(True, "", {"passed": True, "cases": 7, "tolerances": {}})

    def time_kernel(self, spec, source):
        name = variant_of(source)
        self.calls.append(("time", name))
        self.clock.now += self.cost / 2
        return [{**row, "kernel_us": self.kernel_us(name, row)} for row in self._rows(spec)]

    def time_eager(self, spec):
        self.calls.append(("eager", ""))
        return [{**row, "eager_us": self.eager_us(row)} for row in self._rows(spec)]

    def benchmark(self, spec, source):
        name = variant_of(source)
        self.calls.append(("benchmark", name))
        rows = [{**row, "op": spec.name, "kernel_us": self.kernel_us(name, row), "eager_us": self.eager_us(row)}
                for row in self._rows(spec) if row["direction"] == "forward"]
        return {"op": spec.name, "device": "fake H200", "copy_gbs": 4000.0, "rows": rows}


class NoGpuCalls(TuneBackend):
    """A backend any GPU call of which fails the test: reuse must not time or verify."""

    def __init__(self, arch: str = "sm_90"):
        self.arch = arch

    def _fail(self, *_, **__):
        raise AssertionError("the tuning should have been reused: nothing may run on the GPU")

    prepare = verify = time_kernel = time_eager = benchmark = _fail
