"""The checks, one verdict reason each. Each raises a `Failure` that says what the kernel did
and how to fix it; the order inside `check_case` puts the most specific reason first."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from .. import abi
from .compare import bitwise_equal, compare, differing_bits, locate, unwritten
from .data import CaseData
from .runner import (KernelLibrary, allocate_outputs, check_code, fill_value, launch, run_once, sync_or_crash,
                     synchronize)
from .verdict import (ENTRY_POINT_MISSING, FORBIDDEN_SYMBOL, INPUT_MUTATED, NONDETERMINISTIC, POST_TIMING_MISMATCH,
                      STREAM_VIOLATION, UNWRITTEN_OUTPUT, WRONG_RESULT, Counterexample, Failure)


# ------------------------------------------------------------------ before anything runs

def check_library_symbols(library: Path, spec) -> None:
    from ..toolchain import check_symbols

    violations = check_symbols(library, spec.libraries)
    if violations:
        shown = "\n  ".join(violations[:10])
        raise Failure(FORBIDDEN_SYMBOL, f"the compiled kernel calls what a kernel may not:\n  {shown}\n"
                                        f"A kernel uses the CUDA runtime and the C/C++ runtime only"
                                        f"{' (and ' + ', '.join(spec.libraries) + ')' if spec.libraries else ''}.")


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
    for name, storage in data.storages.items():
        if not bitwise_equal(storage, data.snapshots[name]):
            changed = differing_bits(storage, data.snapshots[name])
            ce = counterexample(data, name, mask=changed)
            ce.tensor_role = "input"
            raise Failure(INPUT_MUTATED, f"the kernel wrote to input {name!r} ({int(changed.sum())} element(s) "
                                         f"changed). Inputs are read only: write results only to the outputs",
                          ce)


def check_all_written(data: CaseData, out_a: dict, out_b: dict, *, reason: str = UNWRITTEN_OUTPUT,
                      prefix: str = "") -> None:
    for slot in data.outputs:
        fill_a = torch.tensor(fill_value(slot.dtype, 0), dtype=slot.dtype, device=out_a[slot.name].device)
        fill_b = torch.tensor(fill_value(slot.dtype, 1), dtype=slot.dtype, device=out_a[slot.name].device)
        mask = unwritten(out_a[slot.name], out_b[slot.name], fill_a, fill_b)
        if bool(mask.any()):
            ce = counterexample(data, slot.name, mask=mask)
            raise Failure(reason, f"{prefix}{int(mask.sum())} of {mask.numel()} elements of output {slot.name!r} "
                                  f"were never written (pre-filled with NaN in one run and {fill_b.item()} in "
                                  f"another, they kept the fill). Every output element must be written for every "
                                  f"shape: check the grid covers all rows and the tail past the last full vector",
                          ce)


def check_same_bits(data: CaseData, out_a: dict, out_b: dict, what: str = "two runs") -> None:
    for slot in data.outputs:
        if not bitwise_equal(out_a[slot.name], out_b[slot.name]):
            mask = differing_bits(out_a[slot.name], out_b[slot.name])
            raise Failure(NONDETERMINISTIC,
                          f"{what} on the same inputs gave different bits in {int(mask.sum())} element(s) of "
                          f"output {slot.name!r}; the spec is deterministic. Avoid floating-point atomics "
                          f"across blocks (reduce partials in a fixed order instead)",
                          counterexample(data, slot.name, mask=mask))


def check_close(data: CaseData, outputs: dict, *, reason: str = WRONG_RESULT, prefix: str = "") -> None:
    for slot in data.outputs:
        atol = data.atol[slot.name]
        mismatch = compare(outputs[slot.name], data.truth[slot.name], atol, data.rtol,
                           reference=data.reference.get(slot.name))
        if mismatch is not None:
            raise Failure(reason, f"{prefix}output {slot.name!r} differs from the reference (computed in "
                                  f"float64) beyond atol={atol:.3g} rtol={data.rtol:.3g}",
                          counterexample(data, slot.name, mismatch))


def check_case(lib: KernelLibrary, data: CaseData, stream, *, deterministic: bool) -> dict:
    """Two runs (outputs pre-filled with two different sentinels): inputs untouched, every
    element written, the same bits twice, then within tolerance. Returns run A's outputs."""
    out_a = run_once(lib, data, 0, stream)
    check_inputs_unchanged(data)
    out_b = run_once(lib, data, 1, stream)
    check_inputs_unchanged(data)
    check_all_written(data, out_a, out_b)
    if deterministic:
        check_same_bits(data, out_a, out_b)
    check_close(data, out_a)
    return out_a


# ------------------------------------------------------------------ streams

class SleepCalibration:
    """How many `torch.cuda._sleep` cycles make a millisecond on this GPU (measured once)."""

    cycles_per_ms: float | None = None

    @classmethod
    def cycles(cls, ms: float) -> int:
        if cls.cycles_per_ms is None:
            probe = 10_000_000
            torch.cuda._sleep(probe)  # warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(probe)
            end.record()
            end.synchronize()
            cls.cycles_per_ms = probe / max(start.elapsed_time(end), 1e-3)
        return int(cls.cycles_per_ms * ms)


def check_stream_discipline(lib: KernelLibrary, data: CaseData, expected: dict, *, deterministic: bool,
                            hold_ms: float = 300.0) -> None:
    """Launch on a non-blocking stream held back by a sleeping kernel: nothing may be written
    while it sleeps (read from another stream), and everything must be right once it ran."""
    entry = abi.entry_point(lib.spec, data.direction)
    for attempt in range(3):
        held, reader = torch.cuda.Stream(), torch.cuda.Stream()
        outputs = allocate_outputs(data, 0)
        torch.cuda.synchronize()
        with torch.cuda.stream(held):
            torch.cuda._sleep(SleepCalibration.cycles(hold_ms))
        started = time.perf_counter()
        code = launch(lib, data, outputs, held)
        call_s = time.perf_counter() - started
        check_code(lib, data, code)
        if call_s * 1000 > 0.5 * hold_ms and held.query():
            sync_or_crash(entry)
            raise Failure(STREAM_VIOLATION,
                          f"{entry} blocked the host for {call_s * 1000:.0f} ms, until the held-back stream "
                          f"had run: it waits for the GPU (cudaDeviceSynchronize, cudaStreamSynchronize, a "
                          f"synchronous cudaMemcpy/cudaMalloc/cudaFree). Enqueue everything on `stream` and "
                          f"return without waiting")
        time.sleep(0.03)  # work wrongly sent to another stream gets time to run
        with torch.cuda.stream(reader):
            early = {name: t.clone() for name, t in outputs.items()}
        reader.synchronize()
        if held.query():  # the stream already ran: the look came too late to mean anything
            sync_or_crash(entry)
            hold_ms *= 4
            continue
        for slot in data.outputs:
            fill = torch.tensor(fill_value(slot.dtype, 0), dtype=slot.dtype, device=early[slot.name].device)
            written = ~unwritten(early[slot.name], early[slot.name], fill, fill)
            if bool(written.any()):
                sync_or_crash(entry)
                raise Failure(STREAM_VIOLATION,
                              f"{int(written.sum())} element(s) of output {slot.name!r} were written while "
                              f"the `stream` argument was still held back by earlier work: the kernel runs on "
                              f"another stream (its own, or the default stream). Launch every kernel and copy "
                              f"on `stream` (<<<grid, block, smem, stream>>>, cudaMemsetAsync(..., stream))",
                              counterexample(data, slot.name, mask=written))
        sync_or_crash(entry)
        for slot in data.outputs:
            got = outputs[slot.name]
            if deterministic and bitwise_equal(got, expected[slot.name]):
                continue
            if not deterministic and compare(got, data.truth[slot.name], data.atol[slot.name], data.rtol) is None:
                continue
            raise Failure(STREAM_VIOLATION,
                          f"launched behind other work on `stream`, output {slot.name!r} came out different "
                          f"from the same call on an idle stream: the kernel depends on timing or on another "
                          f"stream. Put every step on `stream`, in order",
                          counterexample(data, slot.name))
        return
    # The GPU ran the sleeping kernel too fast for a clean look three times: do not guess.


# ------------------------------------------------------------------ determinism under load

def check_deterministic_repeats(lib: KernelLibrary, data: CaseData, stream, first: dict, repeats: int = 3) -> None:
    for _ in range(repeats):
        again = run_once(lib, data, 0, stream)
        check_same_bits(data, first, again, what=f"repeated runs on a large case ({data.case.describe()})")


# ------------------------------------------------------------------ after timing

def check_after_timing(lib: KernelLibrary, data: CaseData, fresh: CaseData, stream, *, calls: int = 30) -> None:
    """Call the kernel many times on the same buffers, as a benchmark does; then put new values in
    the same buffers, and then use new buffers: the results must follow the inputs every time.
    Catches kernels that cache results by pointer or by call count."""
    entry = abi.entry_point(lib.spec, data.direction)
    outputs = allocate_outputs(data, 0)
    synchronize(data.device)
    for _ in range(calls):
        check_code(lib, data, launch(lib, data, outputs, stream))
    sync_or_crash(f"{entry} called {calls} times in a row", data.device)
    prefix = f"after {calls} timed calls on the same buffers, "
    check_close(data, outputs, reason=POST_TIMING_MISMATCH, prefix=prefix)
    # Same pointers, new values: the inputs overwritten in place, the same output buffers re-filled.
    data.refill_inputs_from(fresh)
    runs = []
    for which in (0, 1):
        for tensor in outputs.values():
            tensor.fill_(fill_value(tensor.dtype, which))
        synchronize(data.device)
        check_code(lib, data, launch(lib, data, outputs, stream))
        sync_or_crash(entry, data.device)
        runs.append({name: t.clone() for name, t in outputs.items()})
    out_a, out_b = runs
    prefix = f"{prefix[:-2]} and new values written into the same input buffers, "
    check_all_written(data, out_a, out_b, reason=POST_TIMING_MISMATCH, prefix=prefix)
    check_close(data, out_a, reason=POST_TIMING_MISMATCH, prefix=prefix)
    # Fresh buffers with those values.
    out_c = run_once(lib, fresh, 0, stream)
    check_close(fresh, out_c, reason=POST_TIMING_MISMATCH, prefix="after the timed calls, on fresh buffers, ")
