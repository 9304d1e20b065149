"""Read-only mappings of files and what the page cache holds of them: libc's `mmap`,
`munmap`, `madvise` and `mincore` through ctypes.

Shared by the sends from mappings (mapped_sends.py), which keep an
extent mapped while they send from it, and the residency checks
(residency.py), which map a range only to ask `mincore` about it: for a
file mapping, `mincore` answers from the page cache (whether each page is
cached), reads nothing and fills no page table.  Python's `mmap` module
cannot do either: it has no `mincore`, and its objects cannot be unmapped
while a view of them exists.  Nothing here imports grpc.
"""

from __future__ import annotations

import ctypes

import numpy as np

PAGE_BYTES = 4096
PROT_READ, MAP_SHARED, MAP_POPULATE, MADV_RANDOM = 1, 1, 0x8000, 1
MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
mmap = _libc.mmap
mmap.restype = ctypes.c_void_p
mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                 ctypes.c_long]
munmap = _libc.munmap
munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
madvise = _libc.madvise
madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
mincore = _libc.mincore
mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def map_read_only(fd: int, offset: int, length: int, *, populate: bool = False) -> int | None:
    """The address of `length` bytes of `fd` from `offset` (a multiple of PAGE_BYTES)
    mapped read-only and shared (page tables filled at once with `populate`), or None
    when the kernel refused (`ctypes.get_errno()` says why).  Unmap with `munmap`."""
    flags = MAP_SHARED | (MAP_POPULATE if populate else 0)
    address = mmap(None, length, PROT_READ, flags, fd, offset)
    return None if address is None or address == MAP_FAILED else address


def cached_vector(address: int, length: int) -> np.ndarray | None:
    """One byte per page of the `length` bytes mapped at `address`, bit 0 set where
    the page cache holds the page (`mincore`), or None if the kernel refused."""
    vector = np.zeros(-(-length // PAGE_BYTES), dtype=np.uint8)
    if mincore(address, length, vector.ctypes.data) != 0:
        return None
    return vector
