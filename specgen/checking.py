"""`specgen check`'s work for one spec: validate it, then run its reference on small CPU inputs.

The reference is the user's code: it runs in the sandbox (specgen/sandbox.py), one child
per spec file, with a wall-clock timeout and memory, CPU and file-size limits. There it is
called on small inputs of every dtype, once as written and once on float64 copies (the
verifier's truth), and so is each saved value's definition; it must return what the signature declares, leave its inputs alone and
return new tensors, not views of its inputs.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EnvironmentMissing, Location, SpecError
from .spec import KernelSpec, load_spec

SMALL_CAP = 48  # largest size drawn per dim when checking: quick on any CPU
MAX_CHECK_ELEMENTS = 1 << 22  # per tensor: 32 MB in float64
REFERENCE_TIMEOUT_S = float(os.environ.get("SPECGEN_REFERENCE_TIMEOUT", "60"))
REFERENCE_MEMORY_MB = int(os.environ.get("SPECGEN_REFERENCE_MEMORY_MB", "4096"))
REFERENCE_CPU_S = int(os.environ.get("SPECGEN_REFERENCE_CPU", "120"))


@dataclass
class CheckResult:
    path: Path
    spec: KernelSpec | None = None
    error: SpecError | None = None
    runs: list[str] = field(default_factory=list)  # "float32 N=3 D=17" for each reference run

    @property
    def ok(self) -> bool:
        return self.error is None


def check_spec(path: Path, *, samples: int = 2, seed: int = 0, sandbox=None) -> CheckResult:
    """Load the spec here; run its reference in the sandbox (one child for the whole spec)."""
    result = CheckResult(path)
    try:
        spec = load_spec(path)
        result.spec = spec
        result.runs = check_reference(spec, samples=samples, seed=seed, sandbox=sandbox)
    except SpecError as error:
        result.error = error
    return result


def check_reference(spec: KernelSpec, *, samples: int = 2, seed: int = 0, sandbox=None) -> list[str]:
    """Run the reference in the sandbox; the runs made, or a SpecError pointing into the spec."""
    from .sandbox import Limits, shared_sandbox

    limits = Limits(timeout_s=REFERENCE_TIMEOUT_S, cpu_s=REFERENCE_CPU_S, memory_mb=REFERENCE_MEMORY_MB)
    reply = (sandbox or shared_sandbox()).call("specgen.checking:reference_runs", spec, samples, seed,
                                               limits=limits)
    status = reply.get("status")
    if status == "ok":
        return list(reply["value"])
    raise _sandbox_failure(spec, reply, limits)


def _sandbox_failure(spec: KernelSpec, reply: dict, limits) -> SpecError:
    where = Location(spec.path or spec.name, spec.reference_line)
    output = (reply.get("output") or "").strip()
    shown = "\n  its last output:\n    " + "\n    ".join(output.splitlines()[-8:]) if output else ""
    status = reply.get("status")
    if status == "error":
        e = reply.get("error") or {}
        location = Location(e["path"], e.get("line"), e.get("column")) if e.get("path") else None
        return SpecError(e.get("message") or "the reference was refused", location=location, field=e.get("field"),
                         hint=e.get("hint"))
    if status == "timeout":
        return SpecError(f"the reference did not finish within {limits.timeout_s:.0f} s on small CPU inputs "
                         f"(an endless loop?); it was stopped{shown}", location=where, field="reference",
                         hint="SPECGEN_REFERENCE_TIMEOUT=SECONDS allows a slower reference")
    if status == "crash":
        return SpecError(f"{reply.get('type')} escaped the reference: {reply.get('message')}", location=where,
                         field="reference")
    if status == "died":
        signame, code = reply.get("signal"), reply.get("exit_code")
        if signame == "SIGXCPU" or signame == "SIGKILL" and code is None and "cpu" in output.lower():
            why = f"used more than {limits.cpu_s} s of CPU time and was stopped"
        elif signame == "SIGXFSZ":
            why = f"wrote a file larger than {limits.file_mb} MB and was stopped"
        elif signame == "SIGKILL":
            why = f"was killed (SIGKILL; out of memory? the limit is {limits.memory_mb} MB)"
        elif signame:
            why = f"crashed ({signame})"
        else:
            why = (f"ended its process (exit status {code}) without returning: a reference must return its "
                   f"outputs, never call os._exit(), sys.exit() or exit()")
        return SpecError(f"the reference {why}{shown}", location=where, field="reference")
    raise EnvironmentMissing(f"the sandbox that runs spec references failed: {reply.get('output') or reply}")


# ---------------------------------------------------------------------------- in the sandbox

def reference_runs(spec: KernelSpec, samples: int, seed: int) -> list[str]:
    """Runs in the sandbox's grandchild: every dtype x `samples` shapes, as written and in float64."""
    from .inputs import make_inputs, upcast
    from .saved import evaluate_saved

    rng = random.Random(seed)
    runs = []
    first_drawn = (None, None, {})  # the first float64 run at drawn sizes: (inputs, outputs, sizes)
    for dtype in spec.dtypes:
        for k in range(samples):
            dims = small_dims(spec, rng)
            args = make_inputs(spec.signature, dims, dtype, seed=seed + k)
            run_reference_checked(spec, args, dims, dtype)
            # the verifier computes the truth in float64: that must work too (the reference is held
            # to leave its inputs as they were, so the one upcast copy serves every float64 run)
            wide = upcast(args)
            truth = run_reference_checked(spec, wide, dims, "float64")
            if first_drawn[1] is None:
                first_drawn = (wide, truth, dims)
            if k == 0:
                check_deterministic(spec, wide, truth, dims)
                check_scalar_range_ends(spec, wide, truth, dims)
            if spec.backward != "none" and k == 0:
                check_differentiable(spec, wide, dtype)
            if spec.saved_values:  # each definition's shape, in both runs (specgen/saved.py)
                evaluate_saved(spec, args, dtype)
                evaluate_saved(spec, wide, "float64")
            runs.append(f"{dtype} {_sizes(dims)}")
    # every size at its lower bound (a row of one, a single row): where squeeze() and the like change
    # a shape the random sizes above rarely reach
    dims = smallest_dims(spec)
    if _largest_tensor(spec.signature, dims)[0] <= MAX_CHECK_ELEMENTS:
        dtype = spec.dtypes[0]
        args = make_inputs(spec.signature, dims, dtype, seed=seed)
        run_reference_checked(spec, args, dims, dtype)
        check_smallest_sizes(spec, upcast(args), dims, first_drawn)
        runs.append(f"{dtype} {_sizes(dims)} (smallest sizes)")
    return runs


def _finite(outputs) -> bool:
    import torch

    return all(bool(torch.isfinite(o).all()) for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point())


def check_smallest_sizes(spec: KernelSpec, args: dict, dims: dict[str, int], drawn: tuple) -> None:
    """The lower ends of dims are sizes the verifier runs: the reference must be defined there.
    Outputs finite at drawn sizes that turn NaN or inf at the smallest ones (an unbiased variance or
    a kurtosis over one element: 0 / 0) mean dims takes in a size the op is not defined at, and
    every kernel would be checked against NaN there. The hint names the dims whose lower bound,
    raised alone to its drawn size, makes the outputs finite."""
    drawn_args, drawn_truth, drawn_dims = drawn
    if drawn_truth is None or not _finite(drawn_truth):
        return  # already non-finite on ordinary inputs: nothing to compare
    if _finite(run_reference_checked(spec, args, dims, "float64")):
        return
    from .inputs import make_inputs, upcast

    culprits = []
    for name, size in dims.items():
        raised = {**dims, name: drawn_dims.get(name, size)}
        if raised[name] == size or _largest_tensor(spec.signature, raised)[0] > MAX_CHECK_ELEMENTS:
            continue
        wider = upcast(make_inputs(spec.signature, raised, "float64", seed=0))
        if _finite(run_reference_checked(spec, wider, raised, "float64")):
            culprits.append(name)
    named = ", ".join(f"{n}: [{dims[n]}, ...]" for n in culprits) or ", ".join(f"{n}={v}" for n, v in dims.items())
    raise SpecError(f"at the smallest sizes dims allows ({_sizes(dims)}) the reference's outputs are NaN or inf, "
                    f"where they are finite at {_sizes(drawn_dims)} (inputs {_shapes(drawn_args)}); the verifier "
                    f"runs every size at its lower bound",
                    location=Location(spec.path or spec.name, spec.dims_line), field="dims",
                    hint=f"raise the lower bound of {named} to a size where the op is defined (e.g. 2 for "
                         f"an unbiased variance over it)" if culprits else
                         "raise the lower bounds in dims to sizes where the op is defined")


def _sizes(dims: dict[str, int]) -> str:
    return " ".join(f"{s}={v}" for s, v in dims.items())


def smallest_dims(spec: KernelSpec) -> dict[str, int]:
    """Each size at the smallest value dims and the signature's divisibility allow."""
    from .inputs import first_multiple

    divisors = spec.signature.symbol_divisors()
    return {s: first_multiple(spec.dims[s][0], divisors.get(s, 1)) for s in spec.signature.symbols()}


def check_deterministic(spec: KernelSpec, args: dict, first: tuple, dims: dict[str, int]) -> None:
    """A second call on the same inputs gives the first call's outputs: a kernel cannot be verified
    against a reference that draws random numbers (dropout in training mode, torch.rand)."""
    import torch

    again = run_reference_checked(spec, args, dims, "float64")
    for out, other, decl in zip(first, again, spec.signature.outputs):
        same = (torch.equal(out, other) if not out.is_floating_point()
                else torch.allclose(out, other, rtol=1e-6, atol=1e-9, equal_nan=True))
        if not same:
            raise SpecError(f"the reference is not deterministic: two calls on the same inputs {_shapes(args)} "
                            f"gave different values of output {decl.name!r}; specgen checks a kernel against "
                            f"the reference's outputs, so they must depend on the inputs alone",
                            location=Location(spec.path or spec.name, spec.reference_line), field="reference",
                            hint="pass the randomness in as an input (a mask tensor, or a seed argument), or "
                                 "use the op's deterministic form (e.g. dropout with training=False)")


def check_scalar_range_ends(spec: KernelSpec, args: dict, truth: tuple, dims: dict[str, int]) -> None:
    """A scalar's range is what the verifier draws it from, ends included: the reference must be
    defined there. Outputs that are finite at the drawn values and turn NaN or inf at an end
    (`x / temperature` with temperature in [0, 2]) mean the range takes in a value the op is not
    defined at; every such kernel would be checked against NaN."""
    if not _finite(truth):
        return  # already non-finite on these inputs (log of a normal draw): nothing to compare
    for param in spec.signature.scalars:
        ends = param.value_range
        if ends is None or isinstance(args[param.name], bool):
            continue
        for end in ends:
            if end == args[param.name]:
                continue
            try:
                outputs = run_reference_checked(spec, {**args, param.name: end}, dims, "float64")
            except SpecError as error:
                raise _range_end_error(spec, param, end, f": {error}") from None
            if not _finite(outputs):
                raise _range_end_error(spec, param, end, f" makes the reference's outputs NaN or inf on inputs "
                                       f"{_shapes({**args, param.name: end})} where they are finite at "
                                       f"{param.name} = {args[param.name]:g}")


def _range_end_error(spec: KernelSpec, param, end: float, what: str) -> SpecError:
    """The SpecError of a scalar's range end where the reference is undefined, at the signature's line."""
    lo, hi = param.value_range
    inside = (lo + (hi - lo) * 0.01, hi) if end == lo else (lo, hi - (hi - lo) * 0.01)  # a bound moved in
    return SpecError(f"scalar {param.name!r} at {end:g}, an end of its range [{lo:g}, {hi:g}] (the verifier draws "
                     f"from the whole closed range){what}",
                     location=Location(spec.path or spec.name, spec.signature_line), field="signature",
                     hint=f"narrow {param.name}'s range to values where the op is defined "
                          f"(e.g. in [{inside[0]:g}, {inside[1]:g}])")


def small_dims(spec: KernelSpec, rng: random.Random) -> dict[str, int]:
    """Sizes within the spec's ranges, small enough that no tensor exceeds MAX_CHECK_ELEMENTS."""
    from .inputs import sample_dims

    sig = spec.signature
    cap = SMALL_CAP
    while True:
        dims = sample_dims(sig, spec.dims, rng, cap=cap)
        largest, name = _largest_tensor(sig, dims)
        if largest <= MAX_CHECK_ELEMENTS:
            return dims
        if cap == 1:
            raise SpecError(f"{name!r} has {largest} elements even at the smallest sizes dims allows "
                            f"({', '.join(f'{s}={v}' for s, v in dims.items())}); specgen check runs the reference "
                            f"on at most {MAX_CHECK_ELEMENTS} elements per tensor",
                            location=Location(spec.path or spec.name, 1), field="signature",
                            hint="use smaller literal sizes, or lower bounds in dims")
        cap = max(1, cap // 2)


def _largest_tensor(sig, dims: dict[str, int]) -> tuple[int, str]:
    largest, name = 0, ""
    for tname, ttype in [(p.name, p.type) for p in sig.inputs] + [(o.name, o.type) for o in sig.outputs]:
        count = 1
        for size in ttype.shape(dims):
            count *= size
        if count > largest:
            largest, name = count, tname
    return largest, name


def run_reference_checked(spec: KernelSpec, args: dict, dims: dict[str, int], dtype: str) -> tuple:
    """Run the reference and hold it to the signature and to its inputs; SpecError on any mismatch."""
    import torch

    from .inputs import as_tuple, output_problems
    from .reference import reference_failure

    fn = spec.reference_fn()
    before = {name: value.clone() for name, value in args.items() if isinstance(value, torch.Tensor)}
    try:
        with torch.no_grad():
            outputs = as_tuple(fn(**args))
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as error:
        raise reference_failure(spec, error, f"when called with {dtype} inputs {_shapes(args)}: the reference "
                                             f"must return its outputs, never end the process") from None
    except Exception as error:  # the user's code
        raise reference_failure(spec, error, f"when called with {dtype} inputs {_shapes(args)}") from None
    where = Location(spec.path or spec.name, spec.reference_line)
    for name, original in before.items():
        if _changed(original, args[name]):
            raise SpecError(f"the reference changed its input {name!r} in place (called with {dtype} inputs "
                            f"{_shapes(args)}): the packaged op would change the caller's tensor",
                            location=where, field="reference",
                            hint="compute into new tensors: out-of-place ops (x.mul(2), not x.mul_(2)), or "
                                 "x = x.clone() first")
    problems = output_problems(spec.signature, outputs, dims, dtype)
    if problems:
        raise SpecError(_truth_run(dtype) + "; ".join(problems), location=where, field="reference",
                        hint=_dtype_hint(spec, dtype, problems)
                        or "the reference must return what the signature declares, in that order")
    for out, decl in zip(outputs, spec.signature.outputs):
        for name, value in args.items():
            if isinstance(value, torch.Tensor) and _shares_memory(out, value):
                raise SpecError(f"output {decl.name!r} of the reference is its input {name!r} or a view of it "
                                f"(they share memory)", location=where, field="reference",
                                hint=f"return a new tensor, e.g. {name}.clone() or an out-of-place op")
    return outputs


def check_differentiable(spec: KernelSpec, args: dict, dtype: str) -> None:
    """An op with a backward (kernel or reference) has its gradients' truth from autograd through
    the reference: some floating output must depend differentiably on an input the backward
    differentiates. SpecError when none does (a .detach(), torch.no_grad(), integer outputs only).
    An op whose gradient is zero (round, sign) has a graph: that is the user's choice, not caught."""
    import torch

    from .inputs import as_tuple
    from .reference import reference_failure

    wanted = [p.name for p in spec.signature.inputs if p.type.differentiable]
    leaves = {k: v.detach().requires_grad_(True) if k in wanted and isinstance(v, torch.Tensor) else v
              for k, v in args.items()}
    try:
        with torch.enable_grad():
            outputs = as_tuple(spec.reference_fn()(**leaves))
    except Exception as error:  # the user's code, now with inputs that require grad
        raise reference_failure(spec, error, f"when called with {dtype} inputs that require grad {_shapes(args)} "
                                             f"(backward: {spec.backward})") from None
    if any(isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad for o in outputs):
        return
    raise SpecError(f"backward: {spec.backward}, but no output of the reference depends differentiably on "
                    f"{', '.join(repr(n) for n in wanted)} (no autograd graph: the gradients would be zero or "
                    f"undefined); a .detach(), torch.no_grad() or integer outputs only do that",
                    location=Location(spec.path or spec.name, spec.reference_line),
                    field="backward", hint="use backward: none, or compute the output with differentiable ops")


def _truth_run(dtype: str) -> str:
    if dtype != "float64":
        return ""
    return ("in the float64 run (the verifier computes its truth from float64 copies of the floating inputs, "
            "so the reference is also called on float64 tensors): ")


def _dtype_hint(spec: KernelSpec, dtype: str, problems: list[str]) -> str | None:
    if dtype != "float64" or not any("dtype" in p for p in problems):
        return None
    fixed = [o.name for o in spec.signature.outputs if o.type.dtype in ("float32", "float16", "bfloat16")]
    if fixed:
        return (f"{', '.join(fixed)} declared with a fixed dtype still come back in float64 from float64 inputs "
                f"(specgen casts to the declared dtype itself): e.g. work = torch.float64 if x.dtype == "
                f"torch.float64 else torch.float32, then .to(work)")
    return "return outputs in the dtype of the inputs: no fixed .float() or .half() at the end"


def _changed(before, after) -> bool:
    import torch

    if not isinstance(after, torch.Tensor) or after.shape != before.shape or after.dtype != before.dtype:
        return True
    if before.numel() == 0:
        return False
    return not torch.equal(before.reshape(-1).view(torch.uint8), after.detach().contiguous().reshape(-1)
                           .view(torch.uint8))


def _shares_memory(out, value) -> bool:
    import torch

    if not isinstance(out, torch.Tensor) or out.numel() == 0 or value.numel() == 0:
        return False
    try:
        return out.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return False


def _shapes(args: dict) -> str:
    import torch

    return "(" + ", ".join(f"{k}={tuple(v.shape)}" if isinstance(v, torch.Tensor) else f"{k}={v!r}"
                           for k, v in args.items()) + ")"
