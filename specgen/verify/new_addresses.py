"""(verifier version 16) Host memory a kernel keeps per distinct set of tensor addresses.

Why: the endurance run (host_memory.py) calls one case at the same addresses, so a host cache keyed
on the tensors' addresses holds one entry there and never grows. In a real run the caching
allocator hands an op new addresses as shapes, batches and activations change (continuous
batching's eager steps, variable-length packed training, torch.compile's dynamic shapes), and such a
cache, never evicted, grows by an entry per call: held-out attacks-v11's swiglu_a memoizes its row
ranges in a process-wide unordered_map keyed on the whole argument struct, pointers included,
about 2.1 KiB per call on addresses not seen before (0 bytes a call at repeated addresses).

How: the endurance run's small case is staged again with every input and output in a region of its
own, `calls - 1` steps of ADDRESS_STEP bytes longer than the tensor (guarded like any tensor; the
workspace stays where the size function's answer placed it); call k finds every input and output
k steps further on, so no two calls of the run share an address of any tensor. Input regions are
filled with the case's own values repeated element by element, so every call's inputs are an
element-wise rotation of valid inputs (an index stays inside its declared range). The candidate's
process makes every call's argument struct first, then reads its malloc heap in use (mallinfo2, every
arena) before and after the calls; the judge rejects a growth above NEW_ADDRESS_GROWTH_FLOOR that is
also above host_memory.HOST_BYTES_PER_CALL_LIMIT per call (`leaked-memory`), the endurance run's
bound per call. Where mallinfo2 is missing the check is named as not run.
"""
from __future__ import annotations

import torch

from .host_memory import HOST_BYTES_PER_CALL_LIMIT, PROJECTED_CALLS, grown_past, heap_reply
from .layout import ALIGN, Layout, TensorRef, shape_bytes

NEW_ADDRESS_CALLS = 3000  # calls on a GPU (a few ms of launches; the argument structs take ~0.1 s to make)
NEW_ADDRESS_CPU_CALLS = 1000  # the CPU stand-ins'
ADDRESS_STEP = 2 * ALIGN  # bytes between one call's tensor and the next's (PyTorch's caching allocator rounds to 512)
# Growth below which nothing is judged: a one-off allocation during the run (a hash table's bucket
# array rehashed, a glibc arena's header). Above it the bound per call decides at both run lengths
# (3000 and 1000 calls x 1 KiB are above 512 KiB). Honest processes grow 147-294 bytes a call on
# the H200 over the endurance run (host_memory.py); the CPU stand-ins here by under 1 byte a call.
# swiglu_a's 2136 bytes a call is 2x the bound per call and 12x the floor over 3000 calls.
NEW_ADDRESS_GROWTH_FLOOR = 512 << 10


def shifted(refs: dict, by: int) -> dict:
    """`refs` (TensorRefs, or their JSON) with every tensor but the workspace `by` bytes further on."""
    from .. import abi

    out = {}
    for name, ref in refs.items():
        if name == abi.WORKSPACE or not by:
            out[name] = ref
        elif isinstance(ref, TensorRef):
            out[name] = TensorRef(ref.arena, ref.offset + by, ref.shape, ref.dtype)
        else:
            out[name] = [ref[0], int(ref[1]) + by, *ref[2:]]
    return out


def measured(launchers: list) -> dict:
    """Every launcher called once in turn (each already made: its argument struct packed), the heap
    read before the first and after the last. Returns {"code", "failed_call", "host_heap"}: host_heap
    is {"growth", "host_calls", "measure"}, or None where mallinfo2 is missing or a call failed."""
    from .host_memory import _mallinfo2, heap_in_use

    before = heap_in_use() if _mallinfo2() is not None else None
    code, failed = 0, None
    for index, launch in enumerate(launchers):
        code = int(launch() or 0)
        if code:
            failed = index
            break
    after = heap_in_use() if before is not None else None
    report = None
    if before is not None and after is not None and not code:
        report = {"growth": after[0] - before[0], "host_calls": len(launchers), "measure": after[1]}
    return {"code": code, "failed_call": failed, "host_heap": report}


# ------------------------------------------------------------------ the candidate's process and LocalRunner

def serve(message: dict, prepare_call, stream) -> dict:
    """candidate_main's `new_addresses` request: the reply before the device is waited for."""
    step = int(message["step"])
    launchers = [prepare_call({**message, "tensors": shifted(message["tensors"], k * step)}, stream)
                 for k in range(int(message["calls"]))]
    run = measured(launchers)
    return heap_reply(run["code"], run["failed_call"], run["host_heap"])


def local(runner, direction, refs, scalars, dims, *, calls: int, step: int, stream: str = "legacy"):
    """LocalRunner.new_addresses: the same run in this process."""
    refs = runner.with_workspace(refs)
    on = runner._stream(stream)
    run = measured([runner._launcher(direction, shifted(refs, k * step), scalars, dims, on) for k in range(calls)])
    outcome = runner._finished(run["code"])
    outcome.failed_call = run["failed_call"]
    outcome.host_heap = run["host_heap"]
    return outcome


# ------------------------------------------------------------------ the judge

def stage_sliding(runner, data, calls: int, step: int = ADDRESS_STEP) -> None:
    """`data` (a staged case) staged again for `calls` calls at new addresses: each input and output
    in a guarded region `(calls - 1) * step` bytes longer than it, the inputs' regions filled with
    their values repeated element by element; data.input_refs / output_refs become call 0's."""
    from ..inputs import DTYPE_NAMES
    from .data import asked_workspace, place_workspaces

    span = (calls - 1) * step
    values = {name: t.detach().clone() for name, t in data.inputs.items()}
    layout = Layout()
    regions = {name: layout.place("inputs", (t.numel() * t.element_size() + span,), torch.uint8)
               for name, t in values.items()}
    inputs = {name: TensorRef("inputs", regions[name].offset, tuple(t.shape), DTYPE_NAMES[t.dtype])
              for name, t in values.items()}
    outputs = {}
    for slot in data.outputs:
        region = layout.place("outputs", (shape_bytes(slot.shape, slot.dtype) + span,), torch.uint8)
        outputs[slot.name] = TensorRef("outputs", region.offset, tuple(slot.shape), DTYPE_NAMES[slot.dtype])
    runner.ensure({arena: layout.needed(arena) for arena in ("inputs", "outputs")})
    runner.memory.layout = layout
    first = {**inputs, **outputs}
    ends = [{"direction": data.direction, "tensors": refs, "scalars": data.scalars, "dims": data.dims}
            for refs in (first, shifted(first, span))]
    place_workspaces(runner, layout, asked_workspace(runner, ends, [data, data]))
    runner.memory.arm_guards()
    for name, t in values.items():
        flat = t.reshape(-1)
        if flat.numel():
            region = runner.tensor(regions[name]).view(t.dtype)
            region.copy_(flat.repeat(-(-region.numel() // flat.numel()))[:region.numel()].to(region.device))
    data.input_refs, data.output_refs = inputs, outputs
    data.inputs = {name: runner.tensor(ref) for name, ref in inputs.items()}


def new_address_failure(entry: str, report: dict | None, what: str):
    """The leaked-memory Failure for the heap grown over calls at new addresses, or None: a growth
    counts above NEW_ADDRESS_GROWTH_FLOOR and above HOST_BYTES_PER_CALL_LIMIT per call."""
    from .verdict import LEAKED_MEMORY, Failure

    if (grown := grown_past(report, "host_calls", NEW_ADDRESS_GROWTH_FLOOR, HOST_BYTES_PER_CALL_LIMIT)) is None:
        return None
    growth, calls, per_call = grown
    projected = per_call * PROJECTED_CALLS / 1e9
    return Failure(LEAKED_MEMORY, f"{what}: the host memory of the process making the calls grew by {growth} bytes "
                   f"over {calls} calls of {entry}, each with its inputs and outputs at addresses no earlier call of "
                   f"the run used (its malloc heap's bytes in use, mallinfo2, every arena, before and after): "
                   f"{per_call:.0f} bytes per call that the host code kept for a set of tensor addresses and never "
                   f"freed (the bound: {HOST_BYTES_PER_CALL_LIMIT} bytes a call; at the same addresses the "
                   f"endurance run sees nothing). PyTorch's caching allocator hands an op new addresses whenever "
                   f"shapes or batches change (continuous batching, variable-length training), so a run of "
                   f"{PROJECTED_CALLS:,} calls grows by {projected:.1f} GB until the host runs out of memory. Key a "
                   f"host cache on shapes, dtypes and the device, never on tensor addresses, or bound it and evict, "
                   f"or keep nothing between calls")


def check_heap_over_new_addresses(session, data) -> None:
    """(version 16) The endurance run's small case `data` staged again at new addresses for every
    call (stage_sliding) and called NEW_ADDRESS_CALLS times; raises the calls' own failures, then
    leaked-memory. Named as not run where the runner cannot make the run or mallinfo2 is missing."""
    from .. import abi
    from .runner import check_guards, raise_outcome

    direction = data.direction
    where = f"{direction}: the host heap over calls at new addresses"
    run = getattr(session.runner, "new_addresses", None)
    if run is None:
        session.not_run(where, "this runner cannot make the run")
        return
    calls = NEW_ADDRESS_CALLS if session.device.type == "cuda" else NEW_ADDRESS_CPU_CALLS
    session.progress(f"{direction}: {calls} calls, each at new addresses, on {data.case.describe()}")
    stage_sliding(session.runner, data, calls)
    outcome = run(direction, {**data.input_refs, **data.output_refs}, data.scalars, data.dims, calls=calls,
                  step=ADDRESS_STEP)
    what = f"{calls} calls on {data.case.describe()}, each at new addresses"
    raise_outcome(session.spec, data, outcome, what=what)
    check_guards(session.runner, data, f"in {what}: ")
    if outcome.host_heap is None:
        session.not_run(where, "glibc's mallinfo2 is missing here (the resident set is too coarse for 1 KiB a call)")
        return
    if (leak := new_address_failure(abi.entry_point(session.spec, direction), outcome.host_heap, what)) is not None:
        raise leak
