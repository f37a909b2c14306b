"""`specgen check`'s work for one spec: validate it, then run its reference on small CPU inputs."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import Location, SpecError
from .inputs import as_tuple, make_inputs, output_problems, sample_dims, upcast
from .reference import reference_failure
from .spec import KernelSpec, load_spec

SMALL_CAP = 48  # largest size drawn per dim when checking: quick on any CPU


@dataclass
class CheckResult:
    path: Path
    spec: KernelSpec | None = None
    error: SpecError | None = None
    runs: list[str] = field(default_factory=list)  # "float32 N=3 D=17" for each reference run

    @property
    def ok(self) -> bool:
        return self.error is None


def run_reference_checked(spec: KernelSpec, args: dict, dims: dict[str, int], dtype: str) -> tuple:
    """Run the reference and hold its outputs to the signature; SpecError on any mismatch."""
    fn = spec.reference_fn()
    try:
        with torch.no_grad():
            outputs = as_tuple(fn(**args))
    except Exception as error:  # the user's code
        raise reference_failure(spec, error, f"when called with {dtype} inputs {_shapes(args)}") from None
    problems = output_problems(spec.signature, outputs, dims, dtype)
    if problems:
        raise SpecError("; ".join(problems), location=Location(spec.path, spec.reference_line), field="reference",
                        hint="the reference must return what the signature declares, in that order")
    return outputs


def _shapes(args: dict) -> str:
    return "(" + ", ".join(f"{k}={tuple(v.shape)}" if isinstance(v, torch.Tensor) else f"{k}={v!r}"
                           for k, v in args.items()) + ")"


def check_spec(path: Path, *, samples: int = 2, seed: int = 0) -> CheckResult:
    result = CheckResult(path)
    try:
        spec = load_spec(path)
        result.spec = spec
        rng = random.Random(seed)
        for dtype in spec.dtypes:
            for k in range(samples):
                dims = sample_dims(spec.signature, spec.dims, rng, cap=SMALL_CAP)
                args = make_inputs(spec.signature, dims, dtype, seed=seed + k)
                run_reference_checked(spec, args, dims, dtype)
                # the verifier computes the truth in float64: that must work too
                run_reference_checked(spec, upcast(args), dims, "float64")
                result.runs.append(f"{dtype} " + " ".join(f"{s}={v}" for s, v in dims.items()))
    except SpecError as error:
        result.error = error
    return result
