"""Whether the page cache holds file pages, asked without reading them.

Linux 6.5+ counts the cached pages of a range in one system call,
cachestat(2), and reads nothing (a 1-byte RWF_NOWAIT read would start
read-ahead of a missing page before it answers EAGAIN, so it fills the
cache it asks about).  Where the kernel has no cachestat (before 6.5, as
on RHEL 8 and 9 or Ubuntu 22.04, or a seccomp profile refusing it) the
range is mapped read-only for a moment and `mincore(2)` asked, which any
Linux answers from the page cache for a file mapping, reading nothing
and filling no page table: three system calls where cachestat makes one
(`method()` says which; DLFS_RESIDENCY=mincore makes it mincore, so the
tests run the way an older kernel does).  Where neither answers, every
answer is "not known cached", and callers take their read path.
Nothing here imports grpc.
"""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np

from dlfs.server.read import libc_maps

PAGE_BYTES = libc_maps.PAGE_BYTES
# DLFS_RESIDENCY=mincore: ask mincore even where cachestat answers (a test hook).
RESIDENCY_ENV = "DLFS_RESIDENCY"
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
# False once the kernel said it has no cachestat (or the test hook asked for mincore).
_available = os.environ.get(RESIDENCY_ENV, "") != "mincore"


def supported() -> bool:
    """Whether this kernel answers cachestat(2) here (Linux 6.5+, not refused by a
    seccomp profile)."""
    fd = os.open(os.path.abspath(__file__), os.O_RDONLY)
    try:
        return _available and \
            _count(fd, 0, 0, _CachestatRange(), _Cachestat()) is not None
    finally:
        os.close(fd)


def method() -> str:
    """How residency is asked here: "cachestat", or "mincore" (the fallback)."""
    return "cachestat" if supported() else "mincore"


def noted(state: str) -> str:
    """`state` as `dlfs status` shows it, noting residency asked by mincore where the
    kernel has no cachestat."""
    if method() == "cachestat":
        return state
    return f"{state} (residency by mincore: this kernel has no cachestat(2), Linux 6.5+)"


def cached_pages(fd: int, offset: int, length: int) -> int | None:
    """How many pages of the `length` bytes at `offset` of `fd` the page cache holds
    (the pages they touch), or None where neither cachestat nor mincore answers."""
    if _available:
        counted = _count(fd, offset, length, _CachestatRange(), _Cachestat())
        if _available:  # else the kernel turned out to have none: ask mincore
            return counted
    first = offset - offset % PAGE_BYTES
    vector = _mapped_vector(fd, first, offset + length - first)
    return None if vector is None else int(np.count_nonzero(vector & 1))


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
    `fds[i]`, for every i (one cachestat each, or per file one mapping and a
    `mincore` per range).  False where neither answers."""
    if _available:
        answer = _all_counted_cached(fds, offsets, sizes)
        if answer is not None:
            return answer
    return _all_mapped_cached(fds, offsets, sizes)


def _all_counted_cached(fds: np.ndarray, offsets: np.ndarray, sizes: np.ndarray
                        ) -> bool | None:
    """`all_cached` by cachestat, or None when the kernel turned out to have none."""
    span, stat = _CachestatRange(), _Cachestat()
    for fd, offset, size in zip(fds.tolist(), offsets.tolist(), sizes.tolist()):
        cached = _count(fd, offset, size, span, stat)
        if cached is None:
            return False if _available else None
        if cached < pages_of(offset, size):
            return False
    return True


def _all_mapped_cached(fds: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> bool:
    """`all_cached` by mincore: each file's span of the ranges mapped for a moment
    (no page table filled), one `mincore` per range into its own part of one
    vector, and one look at the vector (a ctypes call per range and no more)."""
    first = offsets - offsets % PAGE_BYTES
    pages = -(-(offsets + sizes - first) // PAGE_BYTES)
    touching = pages > 0  # an empty range at a page boundary needs no page
    fds, first, pages = fds[touching], first[touching], pages[touching]
    vector = np.zeros(int(pages.sum()), dtype=np.uint8)
    base = vector.ctypes.data
    places = base + np.cumsum(pages) - pages  # where each range's answer goes
    for fd in np.unique(fds).tolist():
        mine = np.flatnonzero(fds == fd)
        lo = int(first[mine].min())
        length = int((first[mine] + pages[mine] * PAGE_BYTES).max()) - lo
        address = libc_maps.map_read_only(fd, lo, length)
        if address is None:
            return False
        try:
            for start, length_here, place in zip((address + first[mine] - lo).tolist(),
                                                 (pages[mine] * PAGE_BYTES).tolist(),
                                                 places[mine].tolist()):
                if libc_maps.mincore(start, length_here, place) != 0:
                    return False
        finally:
            libc_maps.munmap(address, length)
    return bool((vector & 1).all())


def _mapped_vector(fd: int, offset: int, length: int) -> np.ndarray | None:
    """mincore's answer for `length` bytes of `fd` at `offset` (a page multiple),
    through a mapping made for the question; None if the kernel refused."""
    if length <= 0:
        return np.zeros(0, dtype=np.uint8)
    address = libc_maps.map_read_only(fd, offset, length)
    if address is None:
        return None
    try:
        return libc_maps.cached_vector(address, length)
    finally:
        libc_maps.munmap(address, length)
