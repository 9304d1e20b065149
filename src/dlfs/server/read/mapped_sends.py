"""Windows of cached small pieces sent from read-only mappings of their extents.

Why (docs/DESIGN.md, "How the daemon sends"): a window of small samples read
into a buffer and then sent is copied twice in the daemon, and the first
copy is a read per piece (one io_uring submission carries them, but the
kernel still runs 256 reads for 256 x 4 KiB).  Here the extents are mapped
read-only, and a window whose pages are all cached goes out as `sendmsg`s
whose iovecs point into the mappings: the kernel copies each piece once, from the
page cache into the socket.  No Python object is made per piece: the iovec
array is built by numpy and handed to libc's `sendmsg` through ctypes (which
releases the GIL while the kernel copies).

When: every page of every piece was cached at the mapping's last scan (one
`mincore` over the whole mapping, kept as a prefix sum so that a window is
checked in a few numpy operations; repeated at most every
`limits.mapped_recheck_s` per extent and within `limits.mapped_check_share`
of the time: a scan of an 800 MB extent takes about 15 ms), and every piece
lies inside its mapping.  Otherwise the window takes the read path, which
keeps the device queue full and caches what it reads for the next scan.  A
page evicted between a scan and a send is read by the kernel while that one
send waits.  A page the kernel cannot read
(a file cut short underneath the daemon, a failing device) makes `sendmsg`
fail with EFAULT, never a signal (only the kernel touches the mappings): the
window is then padded with zeros to its announced length and ShortRead
raised, as sendfiles.py does, and the client's CRC32C checks never hand out
the zeros.

Mappings: read-only, MADV_RANDOM, one per extent per process, made from the
ExtentFiles' descriptor (no descriptor of their own; page tables filled at
once when the page cache holds nearly all of the extent), and unmapped when
idle for `limits.extent_map_idle_s` and when its dataset is forgotten (a
freed extent's space is released then).  The idle rule matters to whoever measures: pages mapped by
a process count in its RSS and survive drop_caches while mapped.
Nothing here imports grpc.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import threading
import time
from typing import Callable

import numpy as np

from dlfs import limits
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read import libc_maps, residency
from dlfs.server.read.batch_planning import PieceColumns
from dlfs.server.read.preadv_reads import ShortRead
from dlfs.sockio import IOV_MAX, send_all, wait_writable

log = logging.getLogger(__name__)

_sendmsg = ctypes.CDLL(None, use_errno=True).sendmsg
_sendmsg.restype = ctypes.c_ssize_t
_sendmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


class _MsgHdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


# struct iovec.
_IOVEC = np.dtype([("base", np.uint64), ("len", np.uint64)])


class _Mapping:
    """One extent mapped read-only; unmapped once retired and no send uses it."""

    __slots__ = ("address", "size", "users", "last_used", "retired", "resident", "scanned_at")

    def __init__(self, address: int, size: int, now: float):
        self.address, self.size = address, size
        self.users = 0
        self.last_used = now
        self.retired = False
        # Cached pages before page i, for every i (the last scan's `mincore`), or None.
        self.resident: np.ndarray | None = None
        self.scanned_at = 0.0

    @property
    def whole(self) -> bool:
        """Whether the last scan found every page cached."""
        resident = self.resident
        return resident is not None and int(resident[-1]) == len(resident) - 1

    def unmap(self) -> None:
        libc_maps.munmap(self.address, self.size)


class ExtentMaps:
    """Read-only mappings of cached extents and the sends from them (module docstring).

    The serving threads only look mappings up (`send`); one background
    thread per process ("dlfs-extent-maps") does the rest: it maps an
    extent a send wanted (populating its page tables in one call when the
    page cache holds nearly all of it, MAP_POPULATE: a fault per 64 KiB on
    first touch cost the serving threads more), scans which of its pages
    are cached when the last scan is older than the recheck time, and
    unmaps mappings idle for `idle_s`.  A send whose extents are not mapped
    and scanned yet takes the read path, so no send waits for a scan or a
    mapping.  At most `mapped_bytes_max` bytes are mapped
    at once (page tables cost about 2 MiB per GiB mapped, per process).

    Thread-safe: a mapping is unmapped only when no send holds it.
    `close()` stops the thread and unmaps everything (a send running then
    keeps its mapping until it ends).
    """

    def __init__(self, files: ExtentFiles, *, idle_s: float = limits.extent_map_idle_s,
                 mapped_bytes_max: int = limits.mapped_bytes_max,
                 clock: Callable[[], float] = time.monotonic):
        self._files = files
        self._idle_s = idle_s
        self._mapped_bytes_max = mapped_bytes_max
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._maps: dict[tuple[int, int], _Mapping] = {}
        self.mapped_bytes = 0
        # (dataset id, extent) -> when to try mapping it again (it could not be mapped)
        self._retry_at: dict[tuple[int, int], float] = {}
        self._wanted: set[tuple[int, int]] = set()  # for the thread to check and map
        self._whole_only: set[tuple[int, int]] = set()  # of those, map only if nearly all cached
        self._forgets = 0  # datasets forgotten so far: a mapping begun before one is dropped
        self._budget = limits.mapped_check_burst_s  # seconds of scans it may spend now
        self._budget_at = clock()
        self._thread: threading.Thread | None = None
        self._closed = False

    # --- sending ------------------------------------------------------------------------

    def send(self, sock: socket.socket, dataset_id: int, pieces: PieceColumns, head: bytes, *,
             before: Callable[[], None] | None = None, deadline: float | None = None,
             map_missing: bool = True) -> bool:
        """Send `head`, then `pieces` in buffer-offset order (they must tile the window),
        from the mappings of their extents, if their last scans found every page cached.

        Returns False, having sent nothing, otherwise; an extent not mapped yet
        is then mapped in the background if `map_missing` (else only by
        `map_soon`).  `before()` runs once
        the window will go this way, before anything is sent.  Raises
        ShortRead after padding the window when a page cannot be read,
        socket.timeout when the peer stops reading for the socket's timeout
        or when `deadline` (time.monotonic()) passes first, OSError.
        """
        if not len(pieces) or not head:
            return False
        if len(pieces) == 1 or (pieces.buffer_offset[1:] > pieces.buffer_offset[:-1]).all():
            extent, offset, size = pieces.extent, pieces.file_offset, pieces.size
        else:
            order = np.argsort(pieces.buffer_offset, kind="stable")
            extent, offset, size = pieces.extent[order], pieces.file_offset[order], pieces.size[order]
        first = extent[:1]
        numbers = first if (extent == first).all() else np.unique(extent)
        taken: list[_Mapping] = []
        try:
            for number in numbers.tolist():
                mapping = self._take(dataset_id, number, map_missing)
                if mapping is None:
                    return False
                taken.append(mapping)
            if len(taken) == 1:  # the common case, in fewer array operations
                which, mapping = 0, taken[0]
                bases = np.uint64(mapping.address)
                if int(offset.min()) < 0 or int((offset + size).max()) > mapping.size:
                    return False  # past the end of the file when mapped: the read path
            else:
                which = np.searchsorted(numbers, extent)
                bases = np.array([m.address for m in taken], dtype=np.uint64)[which]
                ends = np.array([m.size for m in taken], dtype=np.int64)[which]
                if (offset < 0).any() or (offset + size > ends).any():
                    return False  # past the end of the file when mapped: the read path
            # An extent whose last scan found every page cached needs no look per piece.
            if not all(m.whole for m in taken) and \
                    not _all_resident(taken, which, offset, size):
                return False  # the read path reads what is missing, all at once
            if before is not None:
                before()
            head_bytes = np.frombuffer(head, dtype=np.uint8)
            iovecs = np.empty(len(size) + 1, dtype=_IOVEC)
            iovecs[0] = (head_bytes.ctypes.data, len(head))
            iovecs["base"][1:] = bases + offset.astype(np.uint64)
            iovecs["len"][1:] = size
            sent = _send_iovecs(sock, iovecs, deadline)
            if sent is not None:  # a page could not be read: keep the framing whole
                starts = len(head) + np.concatenate(([0], np.cumsum(size)[:-1]))
                rest = bytes(len(head) + int(size.sum()) - max(sent, len(head)))
                send_all(sock, [head[sent:], rest] if sent < len(head) else [rest],
                         deadline=deadline)
                k = max(0, int(np.searchsorted(starts, sent, side="right")) - 1)
                raise ShortRead(int(extent[k]), int(offset[k]), int(size[k]),
                                max(0, sent - int(starts[k])))
            return True
        finally:
            for mapping in taken:
                self._release(mapping)

    # --- mappings: the serving side -------------------------------------------------

    def map_soon(self, dataset_id: int, extents: np.ndarray) -> None:
        """Have the background thread map and scan these extents of the dataset, those not
        mapped yet and only if the page cache holds nearly all of each (populated at
        once: a sender that found them cached another way, for its next window)."""
        now = self._clock()
        with self._lock:
            if self._closed:
                return
            for extent_no in np.unique(extents).tolist():
                key = (dataset_id, extent_no)
                if key not in self._maps and now >= self._retry_at.get(key, 0.0):
                    self._want(key, whole_only=True)

    def _take(self, dataset_id: int, extent_no: int, map_missing: bool) -> _Mapping | None:
        """The extent's mapping, held for a send (`_release`), once mapped and scanned;
        None otherwise.  Asks the background thread to map it (if `map_missing`), or to
        scan it again when its last scan is older than `limits.mapped_recheck_s`."""
        key = (dataset_id, extent_no)
        now = self._clock()
        with self._lock:
            if self._closed:
                return None
            mapping = self._maps.get(key)
            if mapping is None or mapping.resident is None:
                if map_missing and now >= self._retry_at.get(key, 0.0):
                    self._want(key)
                return None
            if now >= mapping.scanned_at + limits.mapped_recheck_s:
                self._want(key)
            mapping.users += 1
            mapping.last_used = now
            return mapping

    def _release(self, mapping: _Mapping) -> None:
        with self._lock:
            mapping.users -= 1
            unmap = mapping.retired and mapping.users == 0
        if unmap:
            mapping.unmap()

    def _want(self, key, whole_only: bool = False) -> None:  # caller holds the lock
        if whole_only and key not in self._wanted:
            self._whole_only.add(key)
        elif not whole_only:
            self._whole_only.discard(key)
        if key not in self._wanted:
            self._wanted.add(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dlfs-extent-maps",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def _retire(self, key) -> None:  # caller holds the lock
        mapping = self._maps.pop(key, None)
        if mapping is not None:
            mapping.retired = True
            self.mapped_bytes -= mapping.size
            if mapping.users == 0:
                mapping.unmap()

    # --- mappings: the background thread ---------------------------------------------

    def _run(self) -> None:
        """Map and scan what sends asked for; unmap idle mappings (every idle_s / 2)."""
        with self._lock:
            while not self._closed:
                if not self._wanted:
                    self._wake.wait(self._idle_s / 2)
                wanted, self._wanted = list(self._wanted), set()
                whole_only, self._whole_only = self._whole_only, set()
                self._lock.release()
                try:
                    for key in wanted:
                        try:
                            self._map_and_scan(key, key in whole_only)
                        except Exception as exc:  # a missing or unreadable extent: read path
                            log.debug("extent %s not mapped: %s", key, exc)
                finally:
                    self._lock.acquire()
                now = self._clock()
                for key in [k for k, m in self._maps.items()
                            if m.users == 0 and now - m.last_used >= self._idle_s]:
                    self._retire(key)

    def _map_and_scan(self, key, whole_only: bool = False) -> None:
        """Map the extent if it is not (populated when the page cache holds nearly all of
        it; not at all otherwise if `whole_only`), then scan which of its pages are
        cached (`mincore`, within the time share).  Runs on the background thread."""
        now = self._clock()
        with self._lock:
            if self._closed or not self._spend(now):
                return  # asked again by the next send that wants it
            forgets = self._forgets
            mapping = self._maps.get(key)
            if mapping is not None:
                mapping.users += 1  # not unmapped while scanned
        if mapping is None:
            mapping = self._map(key, now, whole_only)
            if mapping is None:
                return
            with self._lock:
                if self._closed or key in self._maps or self._forgets != forgets:
                    mapping.unmap()  # a dataset was retired meanwhile: maybe this one
                    return
                self._maps[key] = mapping
                self.mapped_bytes += mapping.size
                mapping.users += 1
        try:
            started = time.perf_counter()
            resident = _scan(mapping)
            took = time.perf_counter() - started
        finally:
            self._release(mapping)
        with self._lock:
            self._budget -= took
            mapping.resident = resident
            mapping.scanned_at = now

    def _map(self, key, now: float, whole_only: bool = False) -> _Mapping | None:
        """The extent mapped, or None (then not tried again for a while): when it cannot
        be, or with `whole_only` when the page cache does not hold nearly all of it."""
        with self._files.acquire(*key) as fd:
            size = os.fstat(fd).st_size
            with self._lock:
                refused = self.mapped_bytes + size > self._mapped_bytes_max
            mapping = None
            if not refused:
                pages = residency.cached_pages(fd, 0, size) or 0
                # Nearly all cached: fill the page tables now, reading the few pages
                # missing (a fault per 64 KiB on first touch costs the senders more).
                whole = pages >= residency.pages_of(0, size) * limits.mapped_cached_share_min
                if whole or not whole_only:
                    mapping = _map(fd, size, now, populate=whole)
        if mapping is None:
            with self._lock:
                self._retry_at[key] = now + limits.mapped_recheck_s
        return mapping

    def _spend(self, now: float) -> bool:  # caller holds the lock
        """Whether a scan may run now (`limits.mapped_check_share`)."""
        self._budget = min(limits.mapped_check_burst_s,
                           self._budget + (now - self._budget_at) * limits.mapped_check_share)
        self._budget_at = now
        return self._budget > 0

    # --- the rest -----------------------------------------------------------------------

    def forget_dataset(self, dataset_id: int) -> None:
        """Unmap a dataset's extents (those a send holds go once it ends)."""
        with self._lock:
            self._forgets += 1
            for key in [k for k in self._maps if k[0] == dataset_id]:
                self._retire(key)
            for key in [k for k in self._retry_at if k[0] == dataset_id]:
                del self._retry_at[key]
            self._wanted = {k for k in self._wanted if k[0] != dataset_id}

    def mapped_count(self) -> int:
        with self._lock:
            return len(self._maps)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for key in list(self._maps):
                self._retire(key)
            self._retry_at.clear()
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


def _map(fd: int, size: int, now: float, *, populate: bool) -> _Mapping | None:
    """`size` bytes of `fd` mapped read-only (page tables filled with `populate`), or
    None."""
    address = libc_maps.map_read_only(fd, 0, size, populate=populate)
    if address is None:
        log.debug("mapping an extent failed: %s", os.strerror(ctypes.get_errno()))
        return None
    # A page evicted after the check is then read alone, not with a read-around.
    libc_maps.madvise(address, size, libc_maps.MADV_RANDOM)
    return _Mapping(address, size, now)


def _scan(mapping: _Mapping) -> np.ndarray | None:
    """Cached pages of the mapping before each page (a prefix sum of `mincore`'s
    answer), or None if the kernel refused."""
    vector = libc_maps.cached_vector(mapping.address, mapping.size)
    if vector is None:
        return None
    resident = np.zeros(len(vector) + 1, dtype=np.int32)
    np.cumsum(vector & 1, dtype=np.int32, out=resident[1:])
    return resident


def _all_resident(taken: list[_Mapping], which, offset: np.ndarray, size: np.ndarray) -> bool:
    """Whether the last scans found every page of every piece cached (pieces of
    `taken[which[i]]` at `offset[i]`, `size[i]` bytes)."""
    first = offset // residency.PAGE_BYTES
    last = (offset + np.maximum(size, 1) - 1) // residency.PAGE_BYTES
    if len(taken) == 1:
        return _covered(taken[0].resident, first, last)
    return all(_covered(m.resident, first[which == j], last[which == j])
               for j, m in enumerate(taken))


def _covered(resident: np.ndarray | None, first: np.ndarray, last: np.ndarray) -> bool:
    """Whether pages first[i]..last[i] were all cached, for every i (`resident`: a
    scan's prefix sum)."""
    return resident is not None and \
        bool(((resident[last + 1] - resident[first]) == last - first + 1).all())


def _send_iovecs(sock: socket.socket, iovecs: np.ndarray, deadline: float | None) -> int | None:
    """Send every byte the iovecs name, at most IOV_MAX per `sendmsg`.  Returns None
    when all went out, or the bytes sent before a page could not be read (EFAULT).
    Raises socket.timeout (the socket's timeout per wait, `deadline` for the whole),
    OSError.  `iovecs` is changed (its first unsent entry is advanced)."""
    fd = sock.fileno()
    timeout = sock.gettimeout()
    address = iovecs.ctypes.data
    total = int(iovecs["len"].sum())
    ends = lengths = bases = None  # for a send cut short: made then
    message = _MsgHdr()
    sent = first = 0
    while sent < total:
        message.msg_iov = address + first * _IOVEC.itemsize
        message.msg_iovlen = min(IOV_MAX, len(iovecs) - first)
        n = _sendmsg(fd, ctypes.byref(message), _SEND_FLAGS)
        if n < 0:
            code = ctypes.get_errno()
            if code in (errno.EAGAIN, errno.EWOULDBLOCK):
                wait_writable(fd, timeout, deadline)
                continue
            if code == errno.EINTR:
                continue
            if code == errno.EFAULT:
                return sent
            raise OSError(code, os.strerror(code))
        if deadline is not None and time.monotonic() > deadline and sent + n < total:
            raise socket.timeout("the reply's deadline passed")
        sent += n
        if sent == total:
            break
        if ends is None:  # the iovecs as given, before any is advanced
            lengths, bases = iovecs["len"].copy(), iovecs["base"].copy()
            ends = np.cumsum(lengths)
        first = int(np.searchsorted(ends, sent, side="right"))
        if first < len(iovecs):
            done = sent - (int(ends[first - 1]) if first else 0)
            iovecs["base"][first] = bases[first] + done
            iovecs["len"][first] = lengths[first] - done
    return None
