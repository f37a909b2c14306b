"""Calling a candidate from the judge: outputs pre-filled, one call through the runner (the
candidate's own process, or this one for stand-ins), then what came back turned into a
Failure when it is one (an error code, a lost context, a hang, guard bytes overwritten)."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import abi
from .data import CaseData
from .library import STICKY_ERRORS, WORKSPACE_SHORT, KernelLibrary  # noqa: F401 - re-exported
from .verdict import BAD_WORKSPACE, CRASH, CUDA_ERROR, OUT_OF_BOUNDS, TIMEOUT, Failure


def load_library(spec, library) -> "KernelLibrary":
    """A path is loaded with ctypes; anything else is taken as a library object already
    (the unit tests pass Python stand-ins with the same `call` interface)."""
    return KernelLibrary(spec, library) if isinstance(library, (str, Path)) else library


def fill_value(dtype: torch.dtype, which: int):
    """The two sentinels outputs are pre-filled with: NaN and an odd finite value (ints: min/max)."""
    if dtype.is_floating_point:
        return float("nan") if which == 0 else -3.140625
    if dtype == torch.bool:
        return which == 0
    info = torch.iinfo(dtype)
    return info.min if which == 0 else info.max


_fill_seed = [0]


def fill_outputs(runner, refs: dict, which: int) -> None:
    """Pre-fill the outputs: random bytes (a new pattern every call, so a kernel cannot recognise
    a fill and behave differently), one-byte dtypes the sentinel of `which`. The fills are kept
    on the runner (`runner.fills[which]`) for the unwritten-element check."""
    fills = {}
    for name, ref in refs.items():
        tensor = runner.tensor(ref)
        if tensor.element_size() >= 2 and tensor.numel():
            raw = tensor.reshape(-1).view(torch.uint8)
            _fill_seed[0] += 1
            gen = torch.Generator(device=raw.device).manual_seed(_fill_seed[0])
            raw.copy_(torch.randint(0, 256, raw.shape, generator=gen, dtype=torch.uint8, device=raw.device))
            if which == 1:
                differ_from(tensor, getattr(runner, "fills", {}).get(0, {}).get(name))
        else:
            tensor.fill_(fill_value(tensor.dtype, which))
        fills[name] = tensor.clone()
    if not hasattr(runner, "fills"):
        runner.fills = {}
    runner.fills[which] = fills


FILL_SLICE = 1 << 26  # elements a slice when the second fill is made to differ from the first


def differ_from(tensor: torch.Tensor, first: torch.Tensor | None) -> None:
    """Flip the lowest bit of every element of the second fill that equals the first fill's.
    An element is judged unwritten when it kept both fills; with two independent random fills
    a written 16-bit value matches both with probability 2^-32 per element, about one false
    `unwritten-output` in four for a full-size case of 10^9 bf16 elements (held-out v4, session
    21). With fills that differ everywhere a written value, the same in both runs, never does."""
    from .compare import bits

    if first is None or first.shape != tensor.shape or first.dtype != tensor.dtype or first.device != tensor.device:
        return
    mine, theirs = bits(tensor).reshape(-1), bits(first).reshape(-1)
    for start in range(0, mine.numel(), FILL_SLICE):
        part = mine[start:start + FILL_SLICE]
        part.bitwise_xor_(part == theirs[start:start + FILL_SLICE])


def synchronize(device: torch.device) -> None:
    """Wait for all work on the device (the verifier runs on CPU in its own unit tests)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def raise_outcome(spec, data: CaseData, outcome, what: str | None = None) -> None:
    """A Failure for a call that did not come back clean: lost context, hang, error code."""
    entry = abi.entry_point(spec, data.direction)
    where = what or f"{entry} on {data.case.describe()}"
    if outcome.timeout:
        raise Failure(TIMEOUT, f"{where} did not finish: {outcome.fatal}. It probably never finishes (an infinite "
                               f"loop, __syncthreads in divergent code, a spin wait on a flag)", fatal=True)
    if outcome.fatal:
        raise Failure(CRASH, f"{where}: {outcome.fatal}", fatal=True)
    if outcome.code == WORKSPACE_SHORT:  # asked right before the call (library.KernelLibrary.launcher)
        raise Failure(BAD_WORKSPACE, f"{abi.workspace_function(spec, data.direction)} {outcome.error}, on "
                                     f"{data.case.describe()}{f' ({what})' if what else ''}. The package's "
                                     f"binding asks the size function before every call and hands the kernel what "
                                     f"it answers: return the bytes one call needs, the same answer every time "
                                     f"for the same arguments")
    if outcome.code:
        name = outcome.error or STICKY_ERRORS.get(outcome.code, f"cudaError {outcome.code}")
        text = f"{entry} returned {name} ({outcome.code}) on {data.case.describe()}"
        if outcome.code in STICKY_ERRORS:
            raise Failure(CRASH, text + "; the CUDA context is lost", fatal=True)
        raise Failure(CUDA_ERROR, text + ". A kernel returns cudaSuccess for every valid input of the spec; check "
                                         "launch configurations (grid/block limits, shared memory) for this shape")


def raise_if_faulted(outcome, what: str, advice: str) -> None:
    """A Failure for a call made in a situation of its own (`what`) that hung, lost its context or
    returned a sticky error; an ordinary error code is left to the caller (there it may be the
    right answer)."""
    if outcome.timeout:
        raise Failure(TIMEOUT, f"{what} did not finish: {outcome.fatal}", fatal=True)
    if outcome.fatal or outcome.code in STICKY_ERRORS:
        raise Failure(CRASH, f"{what}: {outcome.fatal or STICKY_ERRORS[outcome.code]}. {advice}", fatal=True)


def check_guards(runner, data: CaseData, what: str = "") -> None:
    broken = runner.memory.broken_guards()
    if broken:
        shown = "; ".join(broken[:4])
        raise Failure(OUT_OF_BOUNDS, f"{what}the kernel wrote outside its outputs (or its workspace) on "
                                     f"{data.case.describe()}: the guard bytes around the tensors changed ({shown}). "
                                     f"Guard every load and store with the tensor's size, including the last "
                                     f"partial vector")


def run_once(runner, data: CaseData, which: int, refs: dict | None = None,
             stream: str = "pool", keep_workspace: bool = False) -> dict[str, torch.Tensor]:
    """Outputs pre-filled with sentinel `which`, one call on a stream of kind `stream`
    (graphs.STREAM_KINDS), checked for a clean return and intact guards; returns copies of the
    outputs. `keep_workspace`: the workspace as the last call left it, not scrambled."""
    refs = refs or data.output_refs
    fill_outputs(runner, refs, which)
    synchronize(data.device)
    outcome = runner.call(data.direction, {**data.input_refs, **refs}, data.scalars, data.dims, stream=stream,
                          **({"keep_workspace": True} if keep_workspace else {}))
    raise_outcome(runner.spec, data, outcome)
    check_guards(runner, data)
    return {name: runner.tensor(ref).clone() for name, ref in refs.items()}


def fills_of(runner, which: int) -> dict:
    return getattr(runner, "fills", {}).get(which, {})


