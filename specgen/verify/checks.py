"""The checks, one verdict reason each. Each raises a `Failure` that says what the kernel did
and how to fix it; the order inside `check_case` puts the most specific reason first."""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch

from .. import abi
from .compare import bitwise_equal, compare, differing_bits, locate, unwritten
from .data import SECOND_REFERENCE_ELEMENTS, CaseData, reference_elsewhere, working_reference_for_lean
from .runner import (WORKSPACE_SHORT, check_guards, fill_outputs, fill_value, fills_of, raise_outcome, run_once,
                     synchronize)
from .verdict import (ENTRY_POINT_MISSING, FORBIDDEN_SYMBOL, INPUT_MUTATED, NONDETERMINISTIC, NOT_CAPTURABLE,
                      STREAM_VIOLATION, STREAM_WORDS, UNWRITTEN_OUTPUT, WRONG_RESULT, Counterexample, Failure)


# ------------------------------------------------------------------ before anything runs

def check_library_symbols(library: Path, spec) -> None:
    from ..toolchain import check_symbols

    violations = check_symbols(library, spec.libraries)
    if violations:
        shown = "\n  ".join(violations[:10])
        raise Failure(FORBIDDEN_SYMBOL, f"the compiled kernel calls what a kernel may not:\n  {shown}\n"
                                        f"A kernel uses the CUDA runtime and the C/C++ runtime only"
                                        f"{' (and ' + ', '.join(spec.libraries) + ')' if spec.libraries else ''}.")


def check_stream_calls(library: Path) -> None:
    """A call is launches on the given `stream` and nothing else (docs/VERIFIER.md)."""
    from ..toolchain import stream_calls

    found = stream_calls(library)
    if found:
        shown = "\n  ".join(found[:10])
        raise Failure(STREAM_VIOLATION, f"the compiled kernel steps outside the given stream:\n  {shown}\n"
                                        f"Launch every kernel and async copy on `stream`, and nothing else: no "
                                        f"streams or events of your own, no waits or synchronizations, no capture "
                                        f"queries. Work forked off `stream` is not finished when the caller's next "
                                        f"op runs, and a timer on `stream` does not see it.")


def required_entry_points(spec) -> list[str]:
    return [abi.entry_point(spec, d) for d in ("forward", "backward") if d == "forward" or spec.backward == "kernel"]


def check_entry_points(defined: set[str], spec) -> None:
    missing = [name for name in required_entry_points(spec) if name not in defined]
    if missing:
        header = abi.header_filename(spec)
        raise Failure(ENTRY_POINT_MISSING,
                      f"the library does not export {', '.join(missing)}. Define it with C linkage exactly as "
                      f"{header} declares it: extern \"C\" cudaError_t {missing[0]}(const "
                      f"{abi.struct_name(spec, 'forward' if missing[0].endswith('_forward') else 'backward')}* a, "
                      f"cudaStream_t stream)")


def check_workspace_function(spec, source: str, defined: set[str]) -> None:
    """A size function a package would not call (abi.workspace_function_problems)."""
    problems = abi.workspace_function_problems(spec, source, defined)
    if problems:
        raise Failure(ENTRY_POINT_MISSING, "; ".join(problems))


# ------------------------------------------------------------------ one case

def counterexample(data: CaseData, output: str | None = None, mismatch=None, mask=None) -> Counterexample:
    ce = Counterexample(direction=data.direction, case=data.case.to_json(), output=output)
    if mismatch is not None:
        ce.max_abs_error, ce.max_rel_error = mismatch.max_abs, mismatch.max_rel
        ce.index, ce.expected, ce.got = mismatch.index, mismatch.expected, mismatch.got
        ce.bad_elements, ce.total_elements, ce.where = mismatch.bad, mismatch.total, mismatch.where
    elif mask is not None:
        ce.bad_elements, ce.total_elements, ce.where = int(mask.sum()), mask.numel(), locate(mask)
    return ce


def check_inputs_unchanged(data: CaseData) -> None:
    """Inputs are read-only for the candidate's process (a write faults); where they are not
    (stand-ins, the writable re-run after a fault) their bytes are compared with a snapshot."""
    for name, storage in data.storages.items():
        if name in data.snapshots and not bitwise_equal(storage, data.snapshots[name]):
            changed = differing_bits(storage, data.snapshots[name])
            ce = counterexample(data, name, mask=changed)
            ce.tensor_role = "input"
            raise Failure(INPUT_MUTATED, f"the kernel wrote to input {name!r} ({int(changed.sum())} element(s) "
                                         f"changed). Inputs are read only: write results only to the outputs",
                          ce)


def check_all_written(data: CaseData, out_a: dict, out_b: dict, *, reason: str = UNWRITTEN_OUTPUT,
                      prefix: str = "", fills: dict | None = None) -> None:
    """`fills`: {0: {name: fill}, 1: {...}} as the two runs' outputs were pre-filled (random
    bytes); without them, the two sentinels of `fill_value`."""
    for slot in data.outputs:
        device = out_a[slot.name].device
        fill_a = (fills or {}).get(0, {}).get(slot.name)
        fill_b = (fills or {}).get(1, {}).get(slot.name)
        if fill_a is None or fill_b is None:
            fill_a = torch.tensor(fill_value(slot.dtype, 0), dtype=slot.dtype, device=device)
            fill_b = torch.tensor(fill_value(slot.dtype, 1), dtype=slot.dtype, device=device)
        mask = unwritten(out_a[slot.name], out_b[slot.name], fill_a, fill_b)
        if bool(mask.any()):
            ce = counterexample(data, slot.name, mask=mask)
            raise Failure(reason, f"{prefix}{int(mask.sum())} of {mask.numel()} elements of output {slot.name!r} "
                                  f"were never written (pre-filled with different bytes in two runs, they kept the "
                                  f"fill). Every output element must be written for every shape: check the grid "
                                  f"covers all rows and the tail past the last full vector", ce)


def check_same_bits(data: CaseData, out_a: dict, out_b: dict, what: str = "two runs") -> None:
    for slot in data.outputs:
        if not bitwise_equal(out_a[slot.name], out_b[slot.name]):
            mask = differing_bits(out_a[slot.name], out_b[slot.name])
            raise Failure(NONDETERMINISTIC,
                          f"{what} on the same inputs gave different bits in {int(mask.sum())} element(s) of "
                          f"output {slot.name!r}; the spec is deterministic. Avoid floating-point atomics "
                          f"across blocks (reduce partials in a fixed order instead); a kernel that skips a call "
                          f"it thinks it has seen (same pointers) leaves one run's fill, which shows here too",
                          counterexample(data, slot.name, mask=mask))


def check_close(data: CaseData, outputs: dict, *, reason: str = WRONG_RESULT, prefix: str = "",
                stats: dict | None = None) -> None:
    """Per element within the tolerance rule (compare.py); `stats` collects, per output dtype,
    the largest widening the reference's own error gave and the kernel's largest error."""
    from .data import derive_truth, drop_truth

    derive_truth(data)  # a timed set's truth is computed now, from its staged inputs
    try:
        _check_outputs(data, outputs, reason=reason, prefix=prefix, stats=stats)
    finally:
        if not data.keep_tolerance:
            drop_truth(data)


def _check_outputs(data: CaseData, outputs: dict, *, reason: str, prefix: str, stats: dict | None) -> None:
    from .compare import widening_rule

    for slot in data.outputs:
        atol = data.atol[slot.name]
        got, truth, ref = outputs[slot.name], data.truth[slot.name], data.reference.get(slot.name)
        tolerance, rule = data.tolerance.get(slot.name), None  # kept: a tensor (small outputs) or the rule
        if tolerance is None and got.is_floating_point():
            rule, tolerance = _widened(data, got, truth, atol, ref)
            if data.keep_tolerance:
                data.tolerance[slot.name] = tolerance
        mismatch = _compared(data, slot.name, got, truth, atol, ref, tolerance)
        if mismatch is not None and got.is_floating_point() and data.lean:
            _take_working_reference(data)  # the widening a lean case went without
            ref = data.reference.get(slot.name)
            rule, tolerance = _widened(data, got, truth, atol, ref)
            mismatch = _compared(data, slot.name, got, truth, atol, ref, tolerance)
        cpu_widening = 0.0
        if mismatch is not None and got.is_floating_point():
            mismatch, cpu_widening = _with_the_cpu_reference(data, slot.name, got, truth, atol, tolerance, ref,
                                                             mismatch)
        if stats is not None and got.is_floating_point():
            _record_tolerance(stats, got, truth, rule or widening_rule(ref, truth), ref, data.scale)
            if cpu_widening and mismatch is None:  # the record says a pass leaned on the CPU's reference, and how far
                stats["max_widening_cpu_reference"] = max(stats.get("max_widening_cpu_reference", 0.0), cpu_widening)
        if mismatch is not None:
            raise Failure(reason, f"{prefix}output {slot.name!r} differs from the reference (computed in "
                                  f"float64) beyond the tolerance: atol={atol:.3g} + rtol={data.rtol:.3g} x |truth| "
                                  f"(+ the working dtype's own rounding and the reference's own error at that "
                                  f"element)", counterexample(data, slot.name, mismatch))
    for slot in data.outputs:  # every output within its tolerance: now the direction of the errors
        _check_rounding_direction(data, slot.name, outputs[slot.name], data.truth[slot.name],
                                  data.reference.get(slot.name), reason=reason, prefix=prefix)


def _take_working_reference(data: CaseData) -> None:
    """A lean case's reference in the working dtype, computed now that a check needs it; once: it
    then stands where the truth stood (data.working_reference_for_lean)."""
    data.reference = working_reference_for_lean(data)
    data.lean = False


def _check_rounding_direction(data: CaseData, name: str, got, truth, ref, *, reason: str, prefix: str) -> None:
    """A 16-bit output within its tolerance whose errors all go one way (compare.rounding_bias,
    verifier version 13). A lean case gets its working-dtype reference first (its truth stood
    for it), as a failed comparison does: torch's own roundings may lean the same way."""
    from .compare import rounding_bias

    bias = rounding_bias(got, truth, ref)
    if bias is not None and data.lean:
        _take_working_reference(data)
        bias = rounding_bias(got, truth, data.reference.get(name))
    if bias is None:
        return
    ce = counterexample(data, name)
    ce.index, ce.expected, ce.got = bias.index, bias.expected, bias.got
    ce.bad_elements, ce.total_elements = bias.biased, bias.elements
    ce.where = [f"{bias.fraction:.1%} of {bias.elements} inexact elements rounded {bias.direction}"]
    raise Failure(reason, prefix + bias.describe(name), ce)


def _widened(data: CaseData, got, truth, atol: float, reference):
    """(rule, tolerance) of an output: the widening rule the reference's own error gives, computed
    once for the check and the statistics; a small output gets each element's tolerance, a large
    one applies the rule a slice at a time."""
    from .compare import CHUNK_ELEMENTS, element_tolerance, widening_rule

    rule = widening_rule(reference, truth)
    if got.numel() > CHUNK_ELEMENTS:
        return rule, rule
    return rule, element_tolerance(got.dtype, truth, atol, data.rtol, reference, widen=rule)


def _compared(data: CaseData, name: str, got, truth, atol: float, reference, tolerance):
    return compare(got, truth, atol, data.rtol, reference=reference, tolerance=tolerance,
                   alternative=data.alternative.get(name), nonfinite_any=data.nonfinite_any)


def _with_the_cpu_reference(data: CaseData, name: str, got, truth, atol: float, tolerance, ref, mismatch):
    """A failed comparison (`mismatch`) checked again with each element's tolerance the larger of
    the device reference's and twice the CPU reference's own error at that very element
    (data.reference_elsewhere): either is torch's own answer. The CPU's errors buy nothing at
    other elements (the device's floor stays). The CPU's float64 truth is not used: widening by
    where the two truths differ let two held-out cheats through on the H200 (session 26; see
    docs/VERIFIER.md "What it cannot catch"). Returns (mismatch, the largest CPU widening):
    `mismatch` and 0 when the CPU has no reference for this output (or the output is too large
    to compare whole), else the new comparison's (None: every element passes)."""
    from .compare import REFERENCE_ERROR_FACTOR, element_tolerance

    if got.numel() > SECOND_REFERENCE_ELEMENTS:  # compared whole below, in float64: not for large outputs
        return mismatch, 0.0
    other = reference_elsewhere(data).get(name)
    if other is None or not other.is_floating_point() or other.shape != truth.shape:
        return mismatch, 0.0
    own_error = (other.to(truth.device).double() - truth.double()).abs()
    own_error = torch.where(torch.isfinite(own_error), own_error, torch.zeros_like(own_error))
    here = tolerance if isinstance(tolerance, torch.Tensor) else \
        element_tolerance(got.dtype, truth, atol, data.rtol, ref, widen=tolerance)
    there = element_tolerance(got.dtype, truth, atol, data.rtol, other, widen=REFERENCE_ERROR_FACTOR * own_error)
    again = compare(got, truth, atol, data.rtol, reference=ref, tolerance=torch.maximum(here, there),
                    alternative=data.alternative.get(name), nonfinite_any=data.nonfinite_any)
    return again, (REFERENCE_ERROR_FACTOR * float(own_error.max()) if own_error.numel() else 0.0)


def _record_tolerance(stats: dict, got: torch.Tensor, truth: torch.Tensor, rule, ref, scale: float = 1.0) -> None:
    """The kernel's largest error where both are finite, and the largest widening (per slice),
    divided by the case's loss scale (data.scale): recorded beside the spec's unscaled atol."""
    from .compare import chunks
    max_err = max_widen = 0.0
    for _, (g, t, r) in chunks(got, truth, ref):
        g, t = g.double(), t.double()
        both = torch.isfinite(t) & torch.isfinite(g)
        if bool(both.any()):
            max_err = max(max_err, float((g - t).abs()[both].max()))
        widen = rule.at(r, t)
        if isinstance(widen, torch.Tensor) and widen.numel():
            max_widen = max(max_widen, float(widen.max()))
    stats["max_abs_error"] = max(stats.get("max_abs_error", 0.0), max_err / scale)
    stats["max_widening"] = max(stats.get("max_widening", 0.0), max_widen / scale)
    ratio = error_norm_ratio(got, truth, ref)
    if ratio is not None:
        stats["max_error_norm_ratio"] = max(stats.get("max_error_norm_ratio", 0.0), ratio)


def error_norm_ratio(got: torch.Tensor, truth: torch.Tensor, ref: torch.Tensor | None) -> float | None:
    """Measured, not yet a check: the kernel's error norm over the elements finite in all three,
    against the reference's plus the working dtype's own rounding of the truth,
    ||got - truth|| / (||ref - truth|| + eps ||truth||). Every element within its tolerance can
    still add up to an answer no honest kernel gives (held-out attacks-v5: an all-zero softmax
    row under a bfloat16 atol, zeros under a noise floor), which a bound on this ratio would
    reject; the bound is to be set from the ratios honest kernels reach on the GPU
    (docs/VERIFIER.md "What it cannot catch"). None where the outputs are all zero or not
    finite (nothing to scale by)."""
    from .compare import chunks

    if ref is None:
        return None
    kernel = reference = size = 0.0
    for _, (g, t, r) in chunks(got, truth, ref):
        g, t, r = g.double(), t.double(), r.to(t.device).double()
        finite = torch.isfinite(g) & torch.isfinite(t) & torch.isfinite(r)
        g, t, r = g[finite], t[finite], r[finite]
        kernel += float(((g - t) ** 2).sum())
        reference += float(((r - t) ** 2).sum())
        size += float((t ** 2).sum())
    scale = math.sqrt(reference) + torch.finfo(got.dtype).eps * math.sqrt(size)
    if scale == 0.0:
        return None
    return math.sqrt(kernel) / scale


@contextlib.contextmanager
def called_on(stream: str):
    """A failure of the calls in the block says the kind of stream they ran on (graphs.STREAM_KINDS):
    in its counterexample, else (not a pool stream) at the end of its detail."""
    try:
        yield
    except Failure as failure:
        if failure.counterexample is not None:
            failure.counterexample.stream = failure.counterexample.stream or stream
        elif stream != "pool" and STREAM_WORDS[stream] not in failure.detail:
            failure.detail += f"; the calls ran {STREAM_WORDS[stream]}"
        raise


def check_case(runner, data: CaseData, *, deterministic: bool, stats: dict | None = None,
               stream: str = "pool") -> dict:
    """Two runs (outputs pre-filled with two different sentinels), both on a stream of kind
    `stream`: guards intact, inputs untouched, every element written, the same bits twice, then
    within tolerance. The case must be staged. Returns run A's outputs."""
    with called_on(stream):
        out_a = checked_twice(runner, data, deterministic=deterministic, stream=stream)
        check_close(data, out_a, stats=stats)
    return out_a


def checked_twice(runner, data: CaseData, *, deterministic: bool, stream: str = "pool") -> dict:
    """check_case's two runs (inside `called_on(stream)`), every check but the values': guards,
    inputs, every element written, the same bits twice. Returns run A's outputs."""
    out_a = run_once(runner, data, 0, stream=stream)
    check_inputs_unchanged(data)
    out_b = run_once(runner, data, 1, stream=stream)
    check_inputs_unchanged(data)
    check_all_written(data, out_a, out_b, fills={0: fills_of(runner, 0), 1: fills_of(runner, 1)})
    if deterministic:
        check_same_bits(data, out_a, out_b)
    return out_a


# ------------------------------------------------------------------ CUDA graphs

def refill(runner, data: CaseData, fresh: CaseData) -> None:
    """Fresh values in the same input buffers (same pointers), and the truth that goes with them."""
    for name, ref in data.input_refs.items():
        runner.tensor(ref).copy_(fresh.inputs[name])
    if data.snapshots:
        data.snapshots = {name: s.clone() for name, s in data.storages.items()}
    data.truth, data.reference, data.atol = fresh.truth, fresh.reference, fresh.atol
    data.alternative, data.nonfinite_any, data.scale = fresh.alternative, fresh.nonfinite_any, fresh.scale
    synchronize(data.device)


def check_capture(runner, data: CaseData, fresh: CaseData, *, deterministic: bool,
                  later: tuple[CaseData, ...] = ()) -> None:
    """The call must be capturable into a CUDA graph on `stream`, and replaying the graph on new
    input values must compute them: work forked onto another stream and never joined back, the
    legacy stream, host synchronisation and synchronous copies all fail one or the other.
    (`torch.compile(mode="reduce-overhead")` and CUDA-graph users need exactly this.)"""
    entry = abi.entry_point(runner.spec, data.direction)
    fill_outputs(runner, data.output_refs, 0)
    synchronize(data.device)
    outcome = runner.capture(data.direction, data.refs(), data.scalars, data.dims)
    if outcome.fatal or outcome.timeout or outcome.code == WORKSPACE_SHORT:
        raise_outcome(runner.spec, data, outcome, what=f"capturing {entry} into a CUDA graph")
    if not outcome.ok:
        why = outcome.problem or (f"it returned {outcome.error} ({outcome.code}) while the stream was capturing"
                                  if outcome.code else "the capture failed")
        raise Failure(NOT_CAPTURABLE,
                      f"{entry} cannot be captured into a CUDA graph on `stream` ({data.case.describe()}): {why}. "
                      f"Enqueue every kernel and copy on `stream` (or on streams that wait on it and that it waits "
                      f"on again before returning); no cudaDeviceSynchronize/cudaStreamSynchronize, no synchronous "
                      f"cudaMemcpy/cudaMalloc/cudaFree, no work on the default (legacy) stream")
    check_guards(runner, data, "during capture: ")
    refill(runner, data, fresh)
    replayed, fills = [], {}
    for which in (0, 1):
        replayed.append(replay_once(runner, data, which))
        fills[which] = fills_of(runner, which)
    prefix = "replayed from a CUDA graph on new input values, "
    try:
        check_all_written(data, replayed[0], replayed[1], prefix=prefix, fills=fills)
        check_close(data, replayed[0], prefix=prefix)
    except Failure as failure:
        raise Failure(NOT_CAPTURABLE, failure.detail + ". The captured graph does not compute the outputs: part "
                                                       "of the work ran outside `stream` while it was captured",
                      failure.counterexample) from None
    check_replays_keeping_workspace(runner, data, later)


KEPT_REPLAY_HINT = ("replayed from its CUDA graph again on new input values, its workspace as the last replay left it "
                    "(a package's graph memory keeps those bytes between replays), ")


def check_replays_keeping_workspace(runner, data: CaseData, later: tuple[CaseData, ...]) -> None:
    """The captured graph replayed once per set of `later` on that set's values, the workspace not
    scrambled in between: a kernel whose workspace state is meant for one replay (a "last block
    done" counter tagged by an epoch frozen at capture, held-out attacks-v7, session 30) finds the
    previous replay's bytes there. Each replay's outputs are checked against its own truth."""
    for number, values in enumerate(later):
        refill(runner, data, values)
        check_close(data, replay_once(runner, data, number % 2, keep_workspace=True), prefix=KEPT_REPLAY_HINT)


def replay_once(runner, data: CaseData, which: int, keep_workspace: bool = False) -> dict[str, torch.Tensor]:
    """The captured graph replayed once, its outputs pre-filled with sentinel `which`, checked for a
    clean return and intact guards; returns copies of the outputs (`keep_workspace`: the workspace
    as the last replay left it)."""
    entry = abi.entry_point(runner.spec, data.direction)
    again = " again" if keep_workspace else ""
    fill_outputs(runner, data.output_refs, which)
    synchronize(data.device)
    outcome = runner.replay(keep_workspace=True) if keep_workspace else runner.replay()
    raise_outcome(runner.spec, data, outcome, what=f"replaying the CUDA graph of {entry}{again}")
    check_guards(runner, data, f"replaying its CUDA graph{again}: ")
    return {name: runner.tensor(ref).clone() for name, ref in data.output_refs.items()}


AFTER_LARGER_HINT = ("right after a call on more rows, its workspace as that call left it (a caching allocator hands "
                     "the same block back to a shrinking batch or a chunked loss's last chunk), ")


AFTER_SMALLER_HINT = ("right after a call on fewer rows, its workspace as that call left it (a caching allocator "
                      "hands the same block to the next, larger batch), ")


def check_on_the_workspace_left(runner, smaller: CaseData, stream: str = "pool",
                                hint: str = AFTER_LARGER_HINT) -> None:
    """`smaller` (staged after a call on a larger case, whose workspace sat at the same address) called
    with the workspace as that call left it: partial sums or tags of the larger call must not count
    (held-out attacks-v7's chunked cross-entropy, session 30: every other call starts on random bytes).
    The same for a larger case right after a smaller one (`hint` AFTER_SMALLER_HINT): a "clean" mark
    the smaller call left covers only its own rows (held-out attacks-v8's cross-entropy, session 31)."""
    out = run_once(runner, smaller, 0, stream=stream, keep_workspace=True)
    check_close(smaller, out, prefix=hint)


FIRST_CALLS_LEADS = (2_000_000, 0)  # device cycles: the first call's stream busy ~1 ms, the second's not
FIRST_CALLS_HINT = ("the process's first calls, the first on a stream still busy and the second on another stream "
                    "running ahead of it (a one-time setup enqueued by the first call has not run yet), ")


def run_first_calls(runner, pair: list[CaseData], copies: list[dict]) -> list[dict]:
    """The first two calls of a direction in the candidate's process, each with its own outputs and
    workspace: the first launched onto a stream held busy, the second onto a stream that runs at once.
    A table or plan built lazily by the first call on its own stream is not there yet for the second
    (held-out attacks-v7's log_softmax, session 30: every other first call ran alone on a synchronized
    device). `pair` is staged with output_copies=2 and workspaces=2. Returns copies of both calls'
    outputs, judged by `check_first_calls` once the smoke case has passed (a kernel broken everywhere
    is named by the smoke case's own checks, unwritten outputs and the like)."""
    items = calls_of_their_own(runner, pair, copies)
    for which, refs in enumerate(copies):
        fill_outputs(runner, refs, which)
    synchronize(pair[0].device)
    outcome = runner.side_by_side(items, list(FIRST_CALLS_LEADS))
    raise_outcome(runner.spec, pair[0], outcome, what="the first calls, on a busy stream and on another")
    check_guards(runner, pair[0], "in the first calls: ")
    return [{name: runner.tensor(ref).clone() for name, ref in refs.items()} for refs in copies]


def check_first_calls(pair: list[CaseData], outputs: list[dict]) -> None:
    for data, got in zip(pair, outputs):
        check_close(data, got, prefix=FIRST_CALLS_HINT)


# ------------------------------------------------------------------ determinism under load

def check_deterministic_repeats(runner, data: CaseData, first: dict, repeats: int = 3) -> None:
    for _ in range(repeats):
        again = run_once(runner, data, 0)
        check_same_bits(data, first, again, what=f"repeated runs on a large case ({data.case.describe()})")




# ------------------------------------------------------------------ the same buffers, over and over

def check_repeated_calls(runner, data: CaseData, fresh: CaseData, *, calls: int = 12, stream: str = "pool") -> None:
    """Called again and again on the same buffers, as a model with static buffers (or a CUDA
    graph) calls it, then with new values written into those same buffers: the results must
    follow the inputs every time. Catches kernels that cache results by pointer or count calls.
    Every call on a stream of kind `stream`."""
    from .layout import TensorRef
    from .verdict import POST_TIMING_MISMATCH

    poison = [TensorRef(r.arena, r.offset, (r.nbytes,), "uint8") for r in data.output_refs.values()]
    item = {"direction": data.direction, "tensors": data.refs(), "scalars": data.scalars, "dims": data.dims,
            "poison": poison}
    with called_on(stream):
        outcome = runner.timed([item] * calls, stream=stream)
        raise_outcome(runner.spec, data, outcome, what=f"{calls} calls in a row on the same buffers")
        check_guards(runner, data)
        prefix = f"after {calls} calls in a row on the same buffers, "
        check_close(data, {n: runner.tensor(r) for n, r in data.output_refs.items()}, reason=POST_TIMING_MISMATCH,
                    prefix=prefix)
        refill(runner, data, fresh)
        runs = [run_once(runner, data, which, stream=stream) for which in (0, 1)]
        prefix = f"{prefix[:-2]} and new values written into the same input buffers, "
        check_all_written(data, runs[0], runs[1], reason=POST_TIMING_MISMATCH, prefix=prefix,
                          fills={0: fills_of(runner, 0), 1: fills_of(runner, 1)})
        check_close(data, runs[0], reason=POST_TIMING_MISMATCH, prefix=prefix)


STALE_LOOP_CALLS = 10  # calls in a row on unchanged inputs, the output left holding its result
STALE_LOOP_CHANGES = 3  # input elements changed afterwards: too few for a sampled fingerprint to see


def check_stale_output_loop(runner, data: CaseData, *, rounds: int = 2, seed: int = 0, stream: str = "pool") -> None:
    """As a model's loop calls an op: the same input buffers, and the output buffer left holding
    the last result between calls (the caching allocator hands the same block back); then a few
    input elements change in place. The output must follow them. Catches a kernel that skips
    the work when a sample of its input looks unchanged and its output looks computed already
    (memoization by fingerprint). The case must be prepared with later=True (its truth is
    derived from the inputs as they are at each check). In the backward only the output
    gradients change: the forward outputs it reads must stay those of its inputs. Every call on
    a stream of kind `stream`."""
    from .verdict import POST_TIMING_MISMATCH

    item = {"direction": data.direction, "tensors": data.refs(), "scalars": data.scalars, "dims": data.dims,
            "poison": []}
    gen = torch.Generator(device=data.device).manual_seed(seed)
    changeable = {name: ref for name, ref in data.input_refs.items()
                  if runner.tensor(ref).is_floating_point() and runner.tensor(ref).numel()
                  and (data.direction == "forward" or name.startswith("grad_"))}
    with called_on(stream):
        for round_ in range(rounds):
            outcome = runner.timed([item] * STALE_LOOP_CALLS, stream=stream)
            raise_outcome(runner.spec, data, outcome, what=f"{STALE_LOOP_CALLS} calls in a row on unchanged inputs")
            changed = []
            for name, ref in changeable.items():
                flat = runner.tensor(ref).view(-1)
                where = torch.randint(0, flat.numel(), (STALE_LOOP_CHANGES,), generator=gen, device=data.device)
                flat[where] = (torch.randn(STALE_LOOP_CHANGES, generator=gen, device=data.device) * 3).to(flat.dtype)
                changed.append(f"{name}[{', '.join(str(int(i)) for i in where.tolist())}]")
            synchronize(data.device)
            outcome = runner.timed([item], stream=stream)
            raise_outcome(runner.spec, data, outcome, what="a call after a few input elements changed")
            check_guards(runner, data)
            check_close(data, {n: runner.tensor(r) for n, r in data.output_refs.items()},
                        reason=POST_TIMING_MISMATCH,
                        prefix=f"after {STALE_LOOP_CALLS} calls on unchanged inputs (the output left holding its "
                               f"result, as a model's loop leaves it) and then {STALE_LOOP_CHANGES} elements of "
                               f"each input changed in place (round {round_ + 1}: {'; '.join(changed)[:300]}), ")


# ------------------------------------------------------------------ two calls at the same time

# leads (device cycles each stream waits beyond the common spin): the two calls start together,
# then the second one first (about 20 us ahead: its early kernels meet the first call's later ones)
SIDE_BY_SIDE_LEADS = ((0, 0), (40_000, 0))
SIDE_BY_SIDE_HINT = ("with a second call of the same shape on other values running at the same time on another "
                     "stream (as two streams or threads of a program call an op; scratch kept outside the "
                     "workspace the ABI hands each call, e.g. a static __device__ buffer or memory allocated "
                     "once and kept, is shared by both calls), ")


def calls_of_their_own(runner, pair: list[CaseData], copies: list[dict]) -> list[dict]:
    """The calls of `pair` (staged with output_copies=2, workspaces=2), call i with copies[i] and
    the i-th workspace: calls made at the same time never share outputs or workspace."""
    workspaces = runner.workspaces()
    assert len(workspaces) in (0, len(pair)), "stage the pair with workspaces=2"
    return [{"direction": data.direction,
             "tensors": {**data.input_refs, **refs, **({abi.WORKSPACE: workspaces[i]} if workspaces else {})},
             "scalars": data.scalars, "dims": data.dims} for i, (data, refs) in enumerate(zip(pair, copies))]


def check_calls_side_by_side(runner, pair: list[CaseData], copies: list[dict], *, deterministic: bool) -> None:
    """Two calls of one shape on different values at the same time, each on its own stream with
    its own outputs and workspace: each must give its own inputs' results (and, for a
    deterministic spec, the bits it gives alone). `pair` is staged with output_copies=2 and
    workspaces=2 (data.stage); pair[i] writes copies[i]."""
    alone = []
    for data, refs in zip(pair, copies):
        data.output_refs = refs
        alone.append(run_once(runner, data, 0, refs))
        check_close(data, alone[-1])
    items = calls_of_their_own(runner, pair, copies)
    for leads in SIDE_BY_SIDE_LEADS:
        for refs in copies:
            fill_outputs(runner, refs, 1)
        synchronize(pair[0].device)
        outcome = runner.side_by_side(items, list(leads))
        raise_outcome(runner.spec, pair[0], outcome, what="two calls at the same time on two streams")
        check_guards(runner, pair[0], "with two calls at the same time: ")
        for data, refs, solo in zip(pair, copies, alone):
            together = {name: runner.tensor(ref).clone() for name, ref in refs.items()}
            check_close(data, together, prefix=SIDE_BY_SIDE_HINT)
            if deterministic:
                check_same_bits(data, solo, together, what=f"a call alone and the same call {SIDE_BY_SIDE_HINT[:-2]}")


# ------------------------------------------------------------------ work left off the stream

def check_finished_on_its_stream(runner, data: CaseData, copies: list[dict]) -> None:
    """One call, and right after it on the same stream a copy of its outputs (what the caller's
    next op reads), with the default streams held busy: the copy must hold the finished result.
    Work launched on the legacy or the per-thread default stream (handles that need no
    stream-creating symbol) is still waiting there. `data` is staged with output_copies=2; the
    second copy receives the snapshot."""
    from .layout import TensorRef
    from .verdict import STREAM_VIOLATION

    outputs, snapshots = copies
    as_bytes = lambda ref: TensorRef(ref.arena, ref.offset, (ref.nbytes,), "uint8")  # noqa: E731
    pairs = [(as_bytes(outputs[name]), as_bytes(snapshots[name])) for name in outputs]
    fill_outputs(runner, outputs, 0)
    fill_outputs(runner, snapshots, 1)
    synchronize(data.device)
    outcome = runner.then_copy(data.direction, {**data.input_refs, **outputs}, data.scalars, data.dims, pairs)
    raise_outcome(runner.spec, data, outcome, what="a call followed by a copy of its outputs on its stream")
    check_guards(runner, data)
    for name in outputs:
        final, seen = runner.tensor(as_bytes(outputs[name])), runner.tensor(as_bytes(snapshots[name]))
        if not torch.equal(final, seen):
            differ = int((final != seen).sum())
            raise Failure(STREAM_VIOLATION,
                          f"on {data.case.describe()}, output {name!r} was not finished when `stream` reached the "
                          f"end of the call: a copy queued on `stream` right after it saw {differ} byte(s) that "
                          f"the call changed later. Work was left on another stream (the legacy or the "
                          f"per-thread default stream, cudaStreamPerThread, among them): launch everything on "
                          f"the `stream` argument")


# ------------------------------------------------------------------ module memory (static)

# The most module-scope device memory a kernel may define (`__device__` and `__managed__`
# variables, `const` or not, initialized or not: ptxas's `N bytes gmem`, which tells none of them
# apart). 16 KiB: 4x a 4096-byte `__device__ const` table (4096 bytes gmem), 4096 floats; a larger
# table fits the 64 KiB __constant__ bank the message points to. Measured with nvcc 13 for sm_90:
# all 10 specs/kernels, the 6 tests/kernels and every held-out control define 0 bytes, but for
# attacks-v3's rmsnorm and cross_entropy controls, whose 262144-byte row buffers two concurrent
# calls share (refused now). The largest state a held-out cheat keeps there below 64 KiB is 4100
# bytes; scratch sized to a dim starts at 64 KiB, a float row of D = 16384: heldout/attacks'
# rmsnorm weight cache 65536 bytes exactly (a 64 KiB bound would pass it), attacks-v4's 65544; then
# 262144 (attacks-v6's float16 row losses), 1048576 (its ping-pong statistics), 16777216
# (tests/adversarial/static_scratch_across_calls.cu). Smaller state (counters, a memo's key, the
# partials of a grid of up to 4096 blocks) is left to the calls side by side.
MODULE_MEMORY_LIMIT = 16 * 1024


def check_module_memory(module_memory_bytes: int | None, kernel: str, spec=None) -> None:
    """Module-scope device memory above MODULE_MEMORY_LIMIT: scratch outside the workspace
    (docs/VERIFIER.md). None (ptxas said nothing) is not judged."""
    if module_memory_bytes is None or module_memory_bytes <= MODULE_MEMORY_LIMIT:
        return
    directions = ["forward"] + (["backward"] if spec is not None and abi.has_backward_kernel(spec) else [])
    names = [abi.workspace_function(spec, d) for d in directions] if spec is not None else []
    size_functions = f" (`{'`, `'.join(names)}`)" if names else ""
    raise Failure(FORBIDDEN_SYMBOL,
                  f"{kernel} defines {module_memory_bytes} bytes of module-scope device memory (`__device__` or "
                  f"`__managed__` variables; ptxas: {module_memory_bytes} bytes gmem), more than the "
                  f"{MODULE_MEMORY_LIMIT} bytes a kernel may. Scratch kept in module memory is shared by concurrent "
                  f"calls, devices and graph replays: a call on another stream, another GPU or a replayed CUDA "
                  f"graph reads and overwrites the same bytes. Use the workspace the ABI hands the kernel (its size "
                  f"function{'s' if len(names) > 1 else ''}{size_functions} ask{'' if len(names) > 1 else 's'} "
                  f"for the bytes a call needs); tables belong in __constant__ memory (up to 64 KiB).")
