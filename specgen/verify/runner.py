"""Calling a candidate: load its shared library with ctypes and call `<op>_<direction>(&args,
stream)` on a torch CUDA stream; a returned error or a broken context becomes a Failure."""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .. import abi
from .data import CaseData
from .verdict import CRASH, CUDA_ERROR, Failure

# cudaError_t codes after which the CUDA context is unusable: the worker must be replaced.
STICKY_ERRORS = {
    700: "cudaErrorIllegalAddress", 702: "cudaErrorLaunchTimeout", 714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction", 716: "cudaErrorMisalignedAddress", 717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc", 719: "cudaErrorLaunchFailure",
}


class KernelLibrary:
    """A loaded candidate. Loaded once per process (a library cannot be unloaded safely)."""

    def __init__(self, spec, path: str | Path):
        self.spec = spec
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))
        self._entries = {}
        for direction in abi.DIRECTIONS:
            name = abi.entry_point(spec, direction)
            fn = getattr(self.lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                self._entries[direction] = fn

    def has(self, direction: str) -> bool:
        return direction in self._entries

    def entry(self, direction: str):
        """The ctypes function of `direction` (argtypes: struct address, stream handle)."""
        return self._entries[direction]

    def error_name(self, code: int) -> str:
        # dlsym through the candidate's handle finds its own libcudart
        try:
            fn = self.lib.cudaGetErrorName
            fn.restype = ctypes.c_char_p
            fn.argtypes = [ctypes.c_int]
            return fn(code).decode()
        except (AttributeError, OSError):
            return STICKY_ERRORS.get(code, f"cudaError {code}")

    def clear_error(self) -> None:
        """Reset the runtime's last error so torch's next launch check does not blame itself."""
        try:
            self.lib.cudaGetLastError()
        except AttributeError:
            pass

    def call(self, direction: str, tensors: dict, scalars: dict, dims: dict, stream: torch.cuda.Stream) -> int:
        args = abi.pack_args(self.spec, direction, tensors, scalars, dims)
        return int(self._entries[direction](ctypes.addressof(args), ctypes.c_void_p(stream.cuda_stream)))


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


def allocate_outputs(data: CaseData, which: int) -> dict[str, torch.Tensor]:
    return {slot.name: torch.full(slot.shape, fill_value(slot.dtype, which), dtype=slot.dtype, device=data.device)
            for slot in data.outputs}


def synchronize(device: torch.device) -> None:
    """Wait for all work on the device (the verifier runs on CPU in its own unit tests)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def sync_or_crash(what: str, device: torch.device = torch.device("cuda")) -> None:
    try:
        synchronize(device)
    except Exception as error:  # torch.AcceleratorError / RuntimeError: an illegal address, a launch failure...
        raise Failure(CRASH, f"{what}: the GPU reported {_first_line(error)}", fatal=True) from None


def launch(lib: KernelLibrary, data: CaseData, outputs: dict[str, torch.Tensor], stream: torch.cuda.Stream) -> int:
    """Call the entry point and return its code, without waiting for the GPU."""
    return lib.call(data.direction, {**data.inputs, **outputs}, data.scalars, data.dims, stream)


def check_code(lib: KernelLibrary, data: CaseData, code: int) -> None:
    if code == 0:
        return
    entry = abi.entry_point(lib.spec, data.direction)
    name = lib.error_name(code)
    where = f"{entry} returned {name} ({code}) on {data.case.describe()}"
    if code in STICKY_ERRORS:
        raise Failure(CRASH, where + "; the CUDA context is lost", fatal=True)
    lib.clear_error()
    raise Failure(CUDA_ERROR, where + ". A kernel returns cudaSuccess for every valid input of the spec; "
                                      "check launch configurations (grid/block limits, shared memory) for this shape")


def run_once(lib: KernelLibrary, data: CaseData, which: int, stream: torch.cuda.Stream) -> dict[str, torch.Tensor]:
    """Outputs pre-filled with sentinel `which`, one call, the whole device synchronised."""
    outputs = allocate_outputs(data, which)
    synchronize(data.device)
    code = launch(lib, data, outputs, stream)
    check_code(lib, data, code)
    sync_or_crash(f"{abi.entry_point(lib.spec, data.direction)} on {data.case.describe()}", data.device)
    return outputs


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
