"""Many file reads in one system call: io_uring, bound with ctypes and numpy.

Why (docs/DESIGN.md, "One submission per window of small pieces"): a
window of small samples is hundreds of pieces, and one `preadv` per piece
costs a system call, a release and re-acquire of the GIL and a turn of a
Python loop each; with several batches in flight the daemon's threads
handed the GIL to each other on every one of those calls.
`RingReads.read` puts every piece in the submission ring as one
IORING_OP_READ and waits for all of them in one `io_uring_enter`, with the
GIL released while the kernel copies.

No compiler and no liburing: the rings are mapped with `mmap` and filled
and drained as numpy structured arrays (the kernel's ABI, stable since
Linux 5.6 for IORING_OP_READ).  A ring is used by the thread that made it
only (`for_this_thread`), and nothing is left in flight when `read` returns
or raises, so a buffer is never written after `read` gave it back.

Where io_uring is missing or refused (old kernels, `kernel.io_uring_disabled`,
container seccomp profiles) `for_this_thread` returns None and callers keep
their one-call-per-piece path.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
import weakref

import numpy as np

from dlfs import limits

log = logging.getLogger(__name__)

# System call numbers: the same on every Linux architecture (added after the
# numbering was unified).
_SYS_IO_URING_SETUP = 425
_SYS_IO_URING_ENTER = 426

_OFF_SQ_RING = 0
_OFF_CQ_RING = 0x8000000
_OFF_SQES = 0x10000000
_FEAT_SINGLE_MMAP = 1 << 0
_ENTER_GETEVENTS = 1 << 0
_SETUP_COOP_TASKRUN = 1 << 8
_SETUP_SINGLE_ISSUER = 1 << 12
_SETUP_DEFER_TASKRUN = 1 << 13
_OP_READ = 22
_OP_FADVISE = 24
POSIX_FADV_WILLNEED = 3
RWF_NOWAIT = 0x8

# struct io_uring_sqe (64 bytes), the fields a read uses; the rest stay zero.
_SQE = np.dtype({"names": ["opcode", "flags", "ioprio", "fd", "off", "addr", "len", "rw_flags",
                           "user_data", "rest"],
                 "formats": [np.uint8, np.uint8, np.uint16, np.int32, np.uint64, np.uint64,
                             np.uint32, np.uint32, np.uint64, (np.uint8, 24)],
                 "offsets": [0, 1, 2, 4, 8, 16, 24, 28, 32, 40], "itemsize": 64})
# struct io_uring_cqe (16 bytes).
_CQE = np.dtype({"names": ["user_data", "res", "flags"],
                 "formats": [np.uint64, np.int32, np.uint32],
                 "offsets": [0, 8, 12], "itemsize": 16})

# A read's length is a u32 in the submission and its result an s32.
READ_BYTES_MAX = (1 << 31) - 1

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class RingReads:
    """One io_uring of `entries` submission slots, for the thread that made it (the
    kernel holds it to that: SINGLE_ISSUER): reads, and WILLNEED advice, in batches."""

    def __init__(self, entries: int = limits.uring_entries):
        params = (ctypes.c_uint32 * 30)()  # struct io_uring_params, 120 bytes
        fd = -1
        # Completions are then run only when this thread waits for them: no
        # interrupt-time work on other CPUs.  Older kernels refuse the flags.
        for flags in (_SETUP_SINGLE_ISSUER | _SETUP_DEFER_TASKRUN,
                      _SETUP_COOP_TASKRUN, 0):
            ctypes.memset(params, 0, ctypes.sizeof(params))
            params[2] = flags
            fd = _syscall(ctypes.c_long(_SYS_IO_URING_SETUP), ctypes.c_long(entries), params)
            if fd >= 0:
                break
            code = ctypes.get_errno()
            if code != errno.EINVAL:
                raise OSError(code, f"io_uring_setup: {os.strerror(code)}")
        if fd < 0:
            raise OSError(errno.EINVAL, "io_uring_setup refused every set of flags")
        self.fd = fd
        self.pid = os.getpid()
        # A thread's ring goes with the thread (threading.local): close its
        # descriptor then too (the mappings close their own duplicates).
        self._close_fd = weakref.finalize(self, os.close, fd)
        try:
            p = np.frombuffer(params, np.uint32)
            self.entries = int(p[0])
            cq_entries, features = int(p[1]), int(p[5])
            sq_off, cq_off = p[10:20].astype(np.int64), p[20:30].astype(np.int64)
            sq_bytes = int(sq_off[6]) + self.entries * 4
            cq_bytes = int(cq_off[5]) + cq_entries * _CQE.itemsize
            shared = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            rw = mmap.PROT_READ | mmap.PROT_WRITE
            if features & _FEAT_SINGLE_MMAP:
                self._sq_map = mmap.mmap(fd, max(sq_bytes, cq_bytes), shared, rw,
                                         offset=_OFF_SQ_RING)
                self._cq_map = self._sq_map
            else:
                self._sq_map = mmap.mmap(fd, sq_bytes, shared, rw, offset=_OFF_SQ_RING)
                self._cq_map = mmap.mmap(fd, cq_bytes, shared, rw, offset=_OFF_CQ_RING)
            self._sqe_map = mmap.mmap(fd, self.entries * _SQE.itemsize, shared, rw,
                                      offset=_OFF_SQES)
            sq = np.frombuffer(self._sq_map, np.uint32)
            cq = np.frombuffer(self._cq_map, np.uint32)
            self._sq_tail = sq[sq_off[1] // 4:sq_off[1] // 4 + 1]
            self._sq_mask = int(sq[sq_off[2] // 4])
            self._cq_head = cq[cq_off[0] // 4:cq_off[0] // 4 + 1]
            self._cq_tail = cq[cq_off[1] // 4:cq_off[1] // 4 + 1]
            self._cq_mask = int(cq[cq_off[2] // 4])
            # Slot i of the submission array always names entry i.
            sq[sq_off[6] // 4:sq_off[6] // 4 + self.entries] = np.arange(self.entries,
                                                                          dtype=np.uint32)
            self._sqes = np.frombuffer(self._sqe_map, _SQE)
            self._cqes = np.frombuffer(self._cq_map, _CQE, count=cq_entries,
                                       offset=int(cq_off[5]))
            self._sqes[:] = np.zeros(1, _SQE)
            # Each entry's user_data is its index in the round (results come back by it).
            self._indices = np.arange(self.entries, dtype=np.uint64)
        except BaseException:
            self._close_fd()
            raise

    def close(self) -> None:
        for name in ("_sqes", "_cqes", "_sq_tail", "_cq_head", "_cq_tail"):
            setattr(self, name, None)
        for m in {id(self._sq_map): self._sq_map, id(self._cq_map): self._cq_map,
                  id(self._sqe_map): self._sqe_map}.values():
            m.close()
        self._close_fd()
        self.fd = -1

    def read(self, fds: np.ndarray, offsets: np.ndarray, addresses: np.ndarray,
             lengths: np.ndarray, flags: int = 0) -> np.ndarray:
        """Read `lengths[i]` bytes of `fds[i]` at `offsets[i]` into memory at `addresses[i]`.

        Returns each read's result (int64): bytes read, or minus an errno
        (-EAGAIN: with RWF_NOWAIT in `flags`, the page cache did not hold the
        start of it).  The caller guarantees that every destination is
        writable memory it keeps alive for the call.  Raises OSError when
        the ring itself fails; nothing is in flight after any return.
        """
        return self._submit(_OP_READ, fds, offsets, addresses, lengths, flags)

    def advise(self, fds: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
               advice: int = POSIX_FADV_WILLNEED) -> np.ndarray:
        """`posix_fadvise(fds[i], offsets[i], lengths[i], advice)` for every i, in one
        system call; returns each one's result (0, or minus an errno)."""
        return self._submit(_OP_FADVISE, fds, offsets, np.zeros(len(offsets), np.uint64),
                            lengths, advice)

    def _submit(self, opcode: int, fds, offsets, addresses, lengths, flags: int) -> np.ndarray:
        count = len(offsets)
        results = np.empty(count, np.int64)
        for lo in range(0, count, self.entries):
            hi = min(count, lo + self.entries)
            results[lo:hi] = self._round(opcode, fds[lo:hi], offsets[lo:hi], addresses[lo:hi],
                                         lengths[lo:hi], flags)
        return results

    def _round(self, opcode: int, fds, offsets, addresses, lengths, flags: int) -> np.ndarray:
        count = len(offsets)
        tail = int(self._sq_tail[0])
        first = tail & self._sq_mask
        # The slots from `first` on, wrapping around the ring at most once; only
        # the fields a read uses are written (the rest stay zero from __init__).
        for lo, slots in ((0, self._sqes[first:first + count]),
                          (self.entries - first, self._sqes[:max(0, first + count - self.entries)])):
            hi = lo + len(slots)
            if hi > lo:
                slots["opcode"] = opcode
                slots["fd"] = fds[lo:hi]
                slots["off"] = offsets[lo:hi]
                slots["addr"] = addresses[lo:hi]
                slots["len"] = lengths[lo:hi]
                slots["rw_flags"] = flags  # fadvise_advice for FADVISE
                slots["user_data"] = self._indices[lo:hi]
        self._sq_tail[0] = (tail + count) & 0xFFFFFFFF
        results = np.empty(count, np.int64)
        unsubmitted, done = count, 0
        try:
            while done < count:
                got = _syscall(ctypes.c_long(_SYS_IO_URING_ENTER), ctypes.c_long(self.fd),
                               ctypes.c_long(unsubmitted), ctypes.c_long(count - done),
                               ctypes.c_long(_ENTER_GETEVENTS), None, ctypes.c_long(0))
                if got >= 0:
                    unsubmitted -= got
                else:
                    code = ctypes.get_errno()
                    if code not in (errno.EINTR, errno.EAGAIN, errno.EBUSY):
                        raise OSError(code, f"io_uring_enter: {os.strerror(code)}")
                done += self._reap(results)
        finally:
            if unsubmitted:
                # Entries the kernel never took: out of the ring, so that the next
                # round does not submit them.
                self._sq_tail[0] = (tail + count - unsubmitted) & 0xFFFFFFFF
            if done < count - unsubmitted:
                self._drain(results, count - unsubmitted - done)
        return results

    def _reap(self, results: np.ndarray) -> int:
        head, tail = int(self._cq_head[0]), int(self._cq_tail[0])
        ready = (tail - head) & 0xFFFFFFFF
        if ready:
            first = head & self._cq_mask
            if first + ready <= len(self._cqes):
                cqe = self._cqes[first:first + ready]  # no wrap: a view, no gather
            else:
                cqe = self._cqes[(head + np.arange(ready)) & self._cq_mask]
            results[cqe["user_data"].astype(np.intp)] = cqe["res"]
            self._cq_head[0] = tail
        return ready

    def _drain(self, results: np.ndarray, outstanding: int) -> None:
        """Wait for reads already submitted (after an error or an exception), so that no
        buffer is written once the caller has it back."""
        while outstanding > 0:
            _syscall(ctypes.c_long(_SYS_IO_URING_ENTER), ctypes.c_long(self.fd),
                     ctypes.c_long(0), ctypes.c_long(outstanding),
                     ctypes.c_long(_ENTER_GETEVENTS), None, ctypes.c_long(0))
            outstanding -= self._reap(results)


_local = threading.local()
_refused: str | None = None  # why io_uring cannot be used in this process, once known
_refused_lock = threading.Lock()


def for_this_thread() -> RingReads | None:
    """This thread's ring, made on first use; None where io_uring is not available."""
    global _refused
    if _refused is not None:
        return None
    ring = getattr(_local, "ring", None)
    if ring is not None and ring.pid == os.getpid():
        return ring
    try:
        ring = RingReads()
    except OSError as exc:
        with _refused_lock:
            if _refused is None:
                _refused = str(exc)
                log.info("io_uring is not available (%s): reads go one system call per "
                         "piece", exc)
        return None
    _local.ring = ring
    return ring


def refuse(reason: str) -> None:
    """Stop using io_uring in this process (configuration, or a kernel that misbehaves)."""
    global _refused
    with _refused_lock:
        _refused = reason


def buffer_address(buffer) -> int:
    """The address of a writable buffer's first byte."""
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data
