"""Whether the page cache holds file pages, asked without reading them: cachestat(2).

Linux 6.5+ counts the cached pages of a range in one system call and reads
nothing (a 1-byte RWF_NOWAIT read would start read-ahead of a missing page
before it answers EAGAIN, so it fills the cache it asks about).  Where the
kernel has no cachestat (older, or a seccomp profile refusing it) every
answer is "not known cached", and callers take their read path.
Nothing here imports grpc.
"""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np

PAGE_BYTES = 4096
# cachestat(2): the same number on every Linux architecture (after the unification).
_SYS_CACHESTAT = 451


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64)]


# PyDLL: cachestat never blocks, so the call keeps the GIL (handing it over and
# back once per piece would cost more than the system call).
_syscall = ctypes.PyDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long
_available = True  # False once the kernel said it has no cachestat


def supported() -> bool:
    """Whether this kernel answers cachestat(2) here (Linux 6.5+, not refused by a
    seccomp profile)."""
    fd = os.open(os.path.abspath(__file__), os.O_RDONLY)
    try:
        return cached_pages(fd, 0, 0) is not None
    finally:
        os.close(fd)


def cached_pages(fd: int, offset: int, length: int) -> int | None:
    """How many pages of the `length` bytes at `offset` of `fd` the page cache holds
    (the pages they touch), or None where the kernel has no cachestat."""
    if not _available:
        return None
    return _count(fd, offset, length, _CachestatRange(), _Cachestat())


def _count(fd: int, offset: int, length: int, span: _CachestatRange,
           stat: _Cachestat) -> int | None:
    """cached_pages, with the call's structures given (reused over many calls)."""
    global _available
    first = offset - offset % PAGE_BYTES
    span.off, span.len = first, offset + length - first
    if _syscall(ctypes.c_long(_SYS_CACHESTAT), ctypes.c_long(fd), ctypes.byref(span),
                ctypes.byref(stat), ctypes.c_long(0)) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _available = False
        return None
    return stat.nr_cache


def pages_of(offset: int, length: int) -> int:
    """The pages the `length` bytes at `offset` touch."""
    first = offset - offset % PAGE_BYTES
    return -(-(offset + length - first) // PAGE_BYTES)


def all_cached(fds: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether the page cache holds every page of `sizes[i]` bytes at `offsets[i]` of
    `fds[i]`, for every i (one cachestat each).  False where the kernel has no
    cachestat."""
    if not _available:
        return False
    span, stat = _CachestatRange(), _Cachestat()
    for fd, offset, size in zip(fds.tolist(), offsets.tolist(), sizes.tolist()):
        cached = _count(fd, offset, size, span, stat)
        if cached is None or cached < pages_of(offset, size):
            return False
    return True
