"""A candidate's compiled library, loaded with ctypes: its entry points and error names.

This module is all the verifier code a candidate's process holds (with the ABI packing):
it calls the kernel and nothing judges anything here.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .. import abi

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
        self._entries, self._sizes = {}, {}
        for direction in abi.DIRECTIONS:
            fn = getattr(self.lib, abi.entry_point(spec, direction), None)
            if fn is not None:
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                self._entries[direction] = fn
            size = getattr(self.lib, abi.workspace_function(spec, direction), None)
            if size is not None:  # optional: absent means no workspace
                size.restype = ctypes.c_size_t
                size.argtypes = [ctypes.c_void_p]
                self._sizes[direction] = size

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

    def sized(self) -> list[str]:
        """The directions whose size function the library defines."""
        return list(self._sizes)

    def workspace_bytes(self, direction: str, tensors: dict, scalars: dict, dims: dict) -> int:
        """What the kernel's size function asks for these arguments (0 without one). Unchecked:
        the judge decides whether the number is believable."""
        size = self._sizes.get(direction)
        if size is None:
            return 0
        args = abi.pack_args(self.spec, direction, tensors, scalars, dims)
        return int(size(ctypes.addressof(args)))

    def call(self, direction: str, tensors: dict, scalars: dict, dims: dict, stream: torch.cuda.Stream) -> int:
        return self.launcher(direction, tensors, scalars, dims, stream)()

    def launcher(self, direction: str, tensors: dict, scalars: dict, dims: dict, stream: torch.cuda.Stream):
        """The call with its argument struct packed now: calling it does only the C call (a
        timed call must not count the host's packing as the kernel's device time). The
        workspace, if any, is `tensors[abi.WORKSPACE]` (uint8)."""
        args = abi.pack_args(self.spec, direction, tensors, scalars, dims)
        abi.set_workspace(args, tensors.get(abi.WORKSPACE))
        entry, address, handle = self._entries[direction], ctypes.addressof(args), ctypes.c_void_p(stream.cuda_stream)

        def launch(keep=args) -> int:  # `keep`: the struct lives as long as the launcher
            return int(entry(address, handle))
        return launch
