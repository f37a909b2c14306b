"""A call on a GPU with no memory left to allocate (verifier version 12).

A kernel written before the ABI's workspace may take scratch with cudaMallocAsync on `stream`. On a
nearly full GPU (training tuned to the memory limit, the backward at the peak of activation memory)
that allocation fails; a kernel that launches with the null pointer then faults and kills the CUDA
context, where torch raises a catchable OutOfMemoryError (Hugging Face's `auto_find_batch_size`
retries with a smaller batch). The verifier's GPU always has room, so one call per direction runs
with the device's memory pool full and unable to grow (pool.StarvedPool): the kernel may return an
error code (it saw the failure) or compute the right outputs without allocating; it may not crash,
write outside its outputs, or return success with wrong outputs. Held-out attacks-v9's bias_gelu
backward used its failed allocation unchecked and passed version 11 (session 34).
"""
from __future__ import annotations

from .. import abi
from .checks import check_close
from .data import CaseData
from .runner import check_guards, fill_outputs, raise_if_faulted, synchronize

HINT = ("check what every cudaMallocAsync returns and return its error (cudaErrorMemoryAllocation) before "
        "launching anything that uses the memory, or take scratch from the workspace the ABI hands each call")


def check_allocation_failure(runner, data: CaseData) -> str | None:
    """`data` (staged) called once with every stream-ordered allocation failing. None when checked;
    the reason when the starved pool could not be set up (the check was not run)."""
    fill_outputs(runner, data.output_refs, 0)
    synchronize(data.device)
    outcome = runner.starved_call(data.direction, {**data.input_refs, **data.output_refs}, data.scalars, data.dims)
    if outcome.skipped:
        return outcome.skipped
    entry = abi.entry_point(runner.spec, data.direction)
    what = (f"{entry} on {data.case.describe()} with no GPU memory left to allocate (every cudaMallocAsync "
            f"failing, as on a nearly full GPU)")
    raise_if_faulted(outcome, what, f"It used memory it did not get, where torch raises a catchable out-of-memory "
                                    f"error: {HINT}")
    check_guards(runner, data, f"with {what}: ")
    if outcome.code:  # it saw the failure and said so: what torch does
        return None
    got = {name: runner.tensor(ref).clone() for name, ref in data.output_refs.items()}
    check_close(data, got, prefix=f"{what}, returning success: ")
    return None
