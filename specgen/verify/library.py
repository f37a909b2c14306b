"""A candidate's compiled library, loaded with ctypes: its entry points and error names.

This module is all the verifier code a candidate's process holds (with the ABI packing):
it calls the kernel and nothing judges anything here.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .. import abi
from .pending_error import ErrorWatch

# cudaError_t codes after which the CUDA context is unusable: the worker must be replaced.
STICKY_ERRORS = {
    700: "cudaErrorIllegalAddress", 702: "cudaErrorLaunchTimeout", 714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction", 716: "cudaErrorMisalignedAddress", 717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc", 719: "cudaErrorLaunchFailure",
}

# What a launch returns, instead of calling the entry point, when the size function asked
# right before the call wants more workspace than the judge placed (no cudaError_t is negative)
WORKSPACE_SHORT = -7001


def shortfall(asked: int, placed: int) -> str:
    """The words for a WORKSPACE_SHORT call (runner.raise_outcome makes them a bad-workspace)."""
    return (f"asked for {asked} bytes of workspace right before a call, more than the {placed} bytes placed for "
            f"it (its largest answer for the case's calls, asked when the case was staged)")


class KernelLibrary:
    """A loaded candidate. Loaded once per process (a library cannot be unloaded safely)."""

    def __init__(self, spec, path: str | Path):
        self.spec = spec
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))
        self.watch = ErrorWatch(self.lib)  # an error left pending by a call that returned success (version 16)
        self._entries, self._sizes = {}, {}
        self.short: str | None = None  # the last WORKSPACE_SHORT call's words
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
        if code == WORKSPACE_SHORT and self.short:
            return self.short
        # dlsym through the candidate's handle finds its own libcudart
        try:
            fn = self.lib.cudaGetErrorName
            fn.restype = ctypes.c_char_p
            fn.argtypes = [ctypes.c_int]
            return fn(code).decode()
        except (AttributeError, OSError):
            return STICKY_ERRORS.get(code, f"cudaError {code}")

    def take_pending(self) -> dict | None:
        """The first call since the last take that returned success with an error pending (pending_error.py)."""
        return self.watch.take()

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
        """The call with its argument struct packed now: calling it does only the C calls (a
        timed call must not count the host's packing as the kernel's device time). The
        workspace placed for it, if any, is `tensors[abi.WORKSPACE]` (uint8). As the package's
        binding calls (torch_binding.cpp.j2: `attach_workspace(args, <size fn>(&args), ...)`,
        then the entry point), each launch first asks the size function about the struct (its
        workspace fields empty), then hands the kernel that many bytes of the placed workspace;
        more than was placed: WORKSPACE_SHORT, and the kernel is not called."""
        args = abi.pack_args(self.spec, direction, tensors, scalars, dims)
        placed = tensors.get(abi.WORKSPACE)
        entry, address, handle = self._entries[direction], ctypes.addressof(args), ctypes.c_void_p(stream.cuda_stream)
        size = self._sizes.get(direction)
        if size is None:
            abi.set_workspace(args, placed)

            def launch(keep=args) -> int:  # `keep`: the struct lives as long as the launcher
                return int(entry(address, handle))
            return self.watch.wrap(launch, direction)
        have = 0 if placed is None else placed.numel()
        start = 0 if placed is None or not have else placed.data_ptr()

        def asked_then_launch(keep=args) -> int:
            keep.workspace, keep.workspace_bytes = None, 0  # as the binding's `args{}` has them when it asks
            asked = int(size(address))
            if asked > have:
                self.short = shortfall(asked, have)
                return WORKSPACE_SHORT
            keep.workspace, keep.workspace_bytes = (start or None) if asked else None, asked
            return int(entry(address, handle))
        return self.watch.wrap(asked_then_launch, direction)
