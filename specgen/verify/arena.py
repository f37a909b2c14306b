"""Device memory shared between the judge and the candidate's process, with per-process rights.

The judge (which makes inputs and checks outputs) creates an allocation with CUDA's virtual
memory API (cuMemCreate), exports it as a file descriptor and maps it read-write. The
candidate's runner process imports the descriptor and maps it with the rights the judge asks
for: the inputs' arena READ-ONLY, so a kernel that writes to an input (even one that
restores it before returning) faults instead of getting away with it; the outputs' arena
read-write. Both processes see the same physical memory: no copies cross.

Only the driver API is used (libcuda through ctypes): no compiled helper, no cuda-python.
"""
from __future__ import annotations

import ctypes
import os

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
CU_MEM_ACCESS_FLAGS_PROT_READ = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class ArenaError(RuntimeError):
    pass


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver = None


def driver():
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise ArenaError(f"cannot load the CUDA driver (libcuda.so.1): {error}") from None
        _check(_driver.cuInit(0), "cuInit")
    return _driver


def _check(code: int, what: str) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        try:
            _driver.cuGetErrorName(code, ctypes.byref(name))
        except Exception:  # noqa: BLE001 - the name is only for the message
            pass
        raise ArenaError(f"{what} failed: CUresult {code} ({(name.value or b'?').decode()})")


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, device)
    return prop


def granularity(device: int) -> int:
    size = ctypes.c_size_t()
    _check(driver().cuMemGetAllocationGranularity(ctypes.byref(size), ctypes.byref(_prop(device)),
                                                  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "cuMemGetAllocationGranularity")
    return size.value


# Address space reserved and left unmapped on each side of every mapping: a kernel's write up
# to this far before or past an arena faults (the candidate's process dies: a crash verdict)
# instead of landing silently in whatever the process mapped next to it.
MARGIN = 1 << 30


class Arena:
    """One mapped allocation: `pointer`, `nbytes`, and `fd` (the exporter's shareable handle)."""

    def __init__(self, handle: int, pointer: int, nbytes: int, fd: int | None, readonly: bool):
        self.handle, self.pointer, self.nbytes, self.fd, self.readonly = handle, pointer, nbytes, fd, readonly

    @classmethod
    def create(cls, nbytes: int, device: int = 0) -> "Arena":
        """A new allocation of at least `nbytes`, mapped read-write here, exported as an fd."""
        drv = driver()
        gran = granularity(device)
        nbytes = max(gran, -(-nbytes // gran) * gran)
        handle = ctypes.c_ulonglong()
        _check(drv.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(nbytes), ctypes.byref(_prop(device)),
                               ctypes.c_ulonglong(0)), f"cuMemCreate({nbytes} bytes)")
        fd = ctypes.c_int(-1)
        _check(drv.cuMemExportToShareableHandle(ctypes.byref(fd), handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                ctypes.c_ulonglong(0)), "cuMemExportToShareableHandle")
        pointer = _map(handle.value, nbytes, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return cls(handle.value, pointer, nbytes, fd.value, readonly=False)

    @classmethod
    def attach(cls, fd: int, nbytes: int, device: int = 0, *, readonly: bool) -> "Arena":
        """Map an exported allocation in this process: read-only or read-write."""
        drv = driver()
        handle = ctypes.c_ulonglong()
        _check(drv.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
               "cuMemImportFromShareableHandle")
        os.close(fd)
        rights = CU_MEM_ACCESS_FLAGS_PROT_READ if readonly else CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        pointer = _map(handle.value, nbytes, device, rights)
        return cls(handle.value, pointer, nbytes, None, readonly=readonly)

    def tensor(self):
        """The whole arena as a torch uint8 tensor on the device (no copy)."""
        import torch

        owner = _CudaArray(self.pointer, self.nbytes, self)
        return torch.as_tensor(owner, device=f"cuda:{torch.cuda.current_device()}")

    def close(self) -> None:
        if self.pointer:
            drv = driver()
            drv.cuMemUnmap(ctypes.c_ulonglong(self.pointer), ctypes.c_size_t(self.nbytes))
            drv.cuMemAddressFree(ctypes.c_ulonglong(self.pointer - MARGIN), ctypes.c_size_t(self.nbytes + 2 * MARGIN))
            drv.cuMemRelease(ctypes.c_ulonglong(self.handle))
            self.pointer = 0
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _map(handle: int, nbytes: int, device: int, rights: int) -> int:
    """Map `handle` in the middle of a reservation MARGIN larger on each side (unmapped)."""
    drv = driver()
    base = ctypes.c_ulonglong()
    _check(drv.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(nbytes + 2 * MARGIN), ctypes.c_size_t(0),
                                   ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
    pointer = ctypes.c_ulonglong(base.value + MARGIN)
    _check(drv.cuMemMap(pointer, ctypes.c_size_t(nbytes), ctypes.c_size_t(0), ctypes.c_ulonglong(handle),
                        ctypes.c_ulonglong(0)), "cuMemMap")
    access = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, device), rights)
    _check(drv.cuMemSetAccess(pointer, ctypes.c_size_t(nbytes), ctypes.byref(access), ctypes.c_size_t(1)),
           "cuMemSetAccess")
    return pointer.value


class _CudaArray:
    """Just enough of `__cuda_array_interface__` for torch.as_tensor; keeps the arena alive."""

    def __init__(self, pointer: int, nbytes: int, owner: Arena):
        self._owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 3, "strides": None}
