"""Windows of cached small pieces sent from read-only mappings of their extents.

Why (docs/DESIGN.md, "How the daemon sends"): a window of small samples read
into a buffer and then sent is copied twice in the daemon, and the first
copy is a read per piece (one io_uring submission carries them, but the
kernel still runs 256 reads for 256 x 4 KiB).  Here the extents are mapped
read-only, and a window whose pages are all cached goes out as `sendmsg`s
whose iovecs point into the mappings: the kernel copies each piece once, from the
page cache into the socket.  No Python object is made per piece: the iovec
array is built by numpy and handed to libc's `sendmsg` through ctypes
(iovec_sends.py; ctypes releases the GIL while the kernel copies).

When: every page of every piece was cached at the mapping's last scan (one
`mincore` over the whole mapping, kept as a prefix sum so that a window is
checked in a few numpy operations; repeated at most every
`limits.mapped_recheck_s` per extent and within `limits.mapped_check_share`
of the time), and every piece
lies inside its mapping.  Otherwise the window takes the read path, which
keeps the device queue full and caches what it reads for the next scan.  A
page evicted between a scan and a send is read by the kernel while that one
send waits.  A page the kernel cannot read
(a file cut short underneath the daemon, a failing device) makes `sendmsg`
fail with EFAULT, never a signal (only the kernel touches the mappings): the
window is then padded with zeros to its announced length and ShortRead
raised, as sendfiles.py does, and the client's CRC32C checks never hand out
the zeros.

A whole GET_BATCH reply goes out in one call of the C extension native_send.c
(`ExtentMaps.send_batch`) when every sample's pages were cached at its
extent's last scan: it checks the ids, writes the BATCH and DATA frame
headers and sends, reading a table per dataset of the mappings (address,
bytes, the last scan) that the background thread keeps.  A send holds no
mapping: a mapping retired while sends that began before are in flight
is unmapped only once they ended (an epoch per retirement).  Where the
extension is missing (no compiler at install) or `DLFS_NATIVE=0`, or a
reply does not qualify, the Python send below serves it.

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
import logging
import os
import socket
import threading
import time
from typing import Callable, Sequence

import numpy as np

from dlfs import limits
from dlfs import native as native_extensions
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read import iovec_sends, libc_maps, residency
from dlfs.server.read.batch_planning import PieceColumns, RequestOrder
from dlfs.server.read.preadv_reads import ShortRead

log = logging.getLogger(__name__)


# The C send of whole replies (native_send.c), or None (dlfs.native.extension).
# Module state so that a test can run the Python send in-process (set it to None).
native = native_extensions.extension("dlfs.server.read.native_send")

# A table row per extent: the columns native_send.c reads (its T_* constants).  The C
# send reads the scan's prefix sums at TABLE_RESIDENT only below TABLE_RESIDENT_ENTRIES;
# the columns before TABLE_USED are written in one assignment (`_publish`).
TABLE_BASE, TABLE_SIZE, TABLE_RESIDENT, TABLE_RESIDENT_ENTRIES, TABLE_WHOLE, TABLE_USED = range(6)
TABLE_COLUMNS = 6


class _Mapping:
    """One extent mapped read-only; unmapped once retired and no send uses it."""

    __slots__ = ("address", "size", "users", "last_used", "retired", "retired_at", "resident",
                 "scanned_at")

    def __init__(self, address: int, size: int, now: float):
        self.address, self.size = address, size
        self.users = 0
        self.last_used = now
        self.retired = False
        self.retired_at = 0  # the epoch it was retired in (ExtentMaps._retire)
        # Cached pages before page i, for every i (the last scan's `mincore`), or None.
        self.resident: np.ndarray | None = None
        self.scanned_at = 0.0

    @property
    def whole(self) -> bool:
        """Whether the last scan found every page cached."""
        return self.resident is not None and _every_page(self.resident)

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

    Thread-safe: a mapping is unmapped only when no send holds it and no C send
    (`send_batch`, which reads the tables and holds none) that began before it
    was retired is in flight.
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
        self._unpopulated: set[tuple[int, int]] = set()  # of those, for residency only
        self._forgets = 0  # datasets forgotten so far: a mapping begun before one is dropped
        self._budget = limits.mapped_check_burst_s  # seconds of scans it may spend now
        self._budget_at = clock()
        self._thread: threading.Thread | None = None
        self._closed = False
        # What the C sends read: per dataset id, a table row per extent (TABLE_* columns)
        # for each mapping scanned, zeros for the rest; grown as extents are mapped.
        self._tables: dict[int, np.ndarray] = {}
        # A retired mapping is unmapped once no send holds it (`users`) and no C send
        # that began before it was retired is in flight: those read its address from a
        # table, and hold no mapping themselves.
        self._epoch = 0  # retirements so far
        self._in_flight: dict[int, int] = {}  # epoch a C send began in -> sends
        self._graveyard: list[_Mapping] = []  # retired, not unmapped yet

    # --- sending ------------------------------------------------------------------------

    def send_batch(self, sock: socket.socket, dataset_id: int, ids: np.ndarray, columns,
                   generation: int, flags: int, *, window_bytes: int, large_ok: bool,
                   payload_max: int, stall_s: float, before: Callable[[int], None]) -> int:
        """Send a whole GET_BATCH reply in one call of the C extension (native_send.c):
        the BATCH frame (`generation`, `flags`, the samples' lengths and CRC32Cs),
        then samples `ids` (int64, request order) in DATA frames of at most
        `window_bytes`, from the mappings of their extents.

        Returns the payload bytes sent, or -1 with nothing sent when the C send
        is not here, or the reply does not qualify: an id out of range, a sample
        stored elsewhere or outside its mapping, an extent not mapped and scanned
        or a page its last scan did not find cached, fewer than
        `limits.mapped_pieces_min` samples, samples averaging
        `limits.sendfile_piece_bytes_min` or more unless `large_ok`, more than
        `payload_max` bytes.  The Python path then serves it (and raises
        what the request deserves).  `columns`: the dataset's (extent, offset,
        length, crc) arrays.  `before(payload)` runs once the reply will go
        this way, before anything is sent.  Each wait for the client is
        bounded by `stall_s`, the whole reply by `stall_s` plus its payload at
        `limits.datapath_reply_bytes_per_s_min`.  Raises ShortRead after
        completing the frame it was in when a page cannot be read,
        socket.timeout, OSError.
        """
        if native is None:
            return -1
        with self._lock:
            rows = self._tables.get(dataset_id)
            if rows is None or self._closed:
                return -1
            epoch = self._epoch  # mappings retired from now on outlive this send
            self._in_flight[epoch] = self._in_flight.get(epoch, 0) + 1
        extent, offset, length, crc = columns
        try:
            return native.send_batch(
                sock.fileno(), ids, extent, offset, length, crc, rows, generation, flags,
                window_bytes, large_ok, limits.mapped_pieces_min,
                limits.sendfile_piece_bytes_min, payload_max, residency.PAGE_BYTES, stall_s,
                limits.datapath_reply_bytes_per_s_min, before)
        except native.PageUnreadable as fault:
            # The pieces as the C send cut them: samples in request order, cut where
            # windows end, empty ones left out.
            pieces = RequestOrder(extent[ids], offset[ids], length[ids]) \
                .in_request_order_by_window(window_bytes)
            raise self._short_read(dataset_id, pieces.extent, pieces.file_offset, pieces.size,
                                   int(fault.args[0])) from None
        finally:
            with self._lock:
                left = self._in_flight.pop(epoch) - 1
                if left:
                    self._in_flight[epoch] = left
                elif self._graveyard:
                    self._sweep()

    def send(self, sock: socket.socket, dataset_id: int, pieces: PieceColumns, head: bytes, *,
             later_heads: Sequence[tuple[int, bytes]] = (),
             before: Callable[[], None] | None = None, deadline: float | None = None,
             map_missing: bool = True) -> bool:
        """Send `head`, then `pieces` in buffer-offset order (they must tile the window),
        from the mappings of their extents, if their last scans found every page cached.

        `later_heads`: (buffer offset, bytes) in ascending order, each offset
        where a piece starts: those bytes go out before that piece (the frame
        header of the next window of a reply sent in one go).  A head begins
        a frame; a frame ends where the next head begins.

        Returns False, having sent nothing, otherwise; an extent not mapped yet
        is then mapped in the background if `map_missing` (else only by
        `map_soon`).  `before()` runs once
        the window will go this way, before anything is sent.  Raises
        ShortRead after padding the frame it was in when a page cannot be read,
        socket.timeout when the peer stops reading for the socket's timeout
        or when `deadline` (time.monotonic()) passes first, OSError.
        """
        if not len(pieces) or not head:
            return False
        if len(pieces) == 1 or (pieces.buffer_offset[1:] > pieces.buffer_offset[:-1]).all():
            extent, offset, size = pieces.extent, pieces.file_offset, pieces.size
            buffer_offset = pieces.buffer_offset
        else:
            order = np.argsort(pieces.buffer_offset, kind="stable")
            extent, offset, size = pieces.extent[order], pieces.file_offset[order], pieces.size[order]
            buffer_offset = pieces.buffer_offset[order]
        numbers = _extent_numbers(extent)
        taken: list[_Mapping] = []
        try:
            for number in numbers.tolist():
                mapping = self._take(dataset_id, number, map_missing)
                if mapping is None:
                    return False
                taken.append(mapping)
            which, cached = _scanned_cached(taken, numbers, extent, offset, size)
            if not cached:  # past a file's end when mapped, or pages missing: the read path
                return False
            if before is not None:
                before()
            bases = np.uint64(taken[0].address) if len(taken) == 1 else \
                np.array([m.address for m in taken], dtype=np.uint64)[which]
            joined, iovecs, is_head = iovec_sends.build_iovecs(
                head, later_heads, buffer_offset, bases + offset.astype(np.uint64), size)
            sent = iovec_sends.send_iovecs(sock, iovecs, deadline)
            if sent is not None:  # a page could not be read: keep the framing whole
                lengths = np.empty(len(is_head), dtype=np.uint64)  # as they were given
                lengths[is_head] = [len(head), *(len(h) for _, h in later_heads)]
                lengths[~is_head] = size
                entry = iovec_sends.complete_frame(sock, joined, lengths, is_head, sent, deadline)
                # The piece it stopped in (the one after, when in a head); a Unix
                # socket fails a whole call, so the piece that could not be read may
                # come later.
                first = entry - int(np.count_nonzero(is_head[:entry]))
                raise self._short_read(dataset_id, extent, offset, size, first)
            return True
        finally:
            for mapping in taken:
                self._release(mapping)

    def _short_read(self, dataset_id: int, extent: np.ndarray, offset: np.ndarray,
                    size: np.ndarray, first: int) -> ShortRead:
        """ShortRead for the first piece from `first` on that reaches past its extent
        file's end now (what fails a send from a mapping), or for piece `first`
        when none does (the device failed).  A loop per piece: a failure only."""
        file_ends: dict[int, int] = {}
        for k in range(first, len(size)):
            extent_no = int(extent[k])
            if extent_no not in file_ends:
                with self._files.acquire(dataset_id, extent_no) as fd:
                    file_ends[extent_no] = os.fstat(fd).st_size
            start, wanted = int(offset[k]), int(size[k])
            if start + wanted > file_ends[extent_no]:
                return ShortRead(extent_no, start, wanted,
                                 min(wanted, max(0, file_ends[extent_no] - start)))
        return ShortRead(int(extent[first]), int(offset[first]), int(size[first]), 0)

    # --- mappings: the serving side -------------------------------------------------

    def map_soon(self, dataset_id: int, extents: np.ndarray, *, populate: bool = True) -> None:
        """Have the background thread map and scan these extents of the dataset, those not
        mapped yet and only if the page cache holds nearly all of each: a sender that
        found them cached another way, for its next window.  Populated at once if
        `populate` (sends will come from them); else only scanned, which is all
        `resident` needs (no page table is filled, nothing counts in the RSS)."""
        now = self._clock()
        with self._lock:
            if self._closed:
                return
            for extent_no in np.unique(extents).tolist():
                key = (dataset_id, extent_no)
                if key not in self._maps and now >= self._retry_at.get(key, 0.0):
                    self._want(key, whole_only=True, populate=populate)

    def resident(self, dataset_id: int, extent: np.ndarray, offset: np.ndarray,
                 size: np.ndarray) -> bool | None:
        """Whether the last scans of these extents' mappings found every page of the
        pieces (`extent[i]`, `offset[i]`, `size[i]` bytes) cached; None when an extent
        is not mapped and scanned (then ask the kernel: residency.all_cached).  A
        few array operations where the kernel takes a system call per piece.  As
        stale as the scans (`limits.mapped_recheck_s`; a scan is asked for when
        older): a page evicted since is read while its `sendfile` waits."""
        if not len(size):
            return None
        numbers = _extent_numbers(extent)
        now = self._clock()
        found: list[_Mapping] = []
        with self._lock:
            for number in numbers.tolist():
                mapping = self._scanned((dataset_id, number), now)
                if mapping is None:
                    return None
                found.append(mapping)
        return _scanned_cached(found, numbers, extent, offset, size)[1]

    def _take(self, dataset_id: int, extent_no: int, map_missing: bool) -> _Mapping | None:
        """The extent's mapping, held for a send (`_release`), once mapped and scanned;
        None otherwise.  Asks the background thread to map it (if `map_missing`), or to
        scan it again when its last scan is older than `limits.mapped_recheck_s`."""
        key = (dataset_id, extent_no)
        now = self._clock()
        with self._lock:
            if self._closed:
                return None
            mapping = self._scanned(key, now)
            if mapping is None:
                if map_missing and now >= self._retry_at.get(key, 0.0):
                    self._want(key)
                return None
            mapping.users += 1
            return mapping

    def _scanned(self, key, now: float) -> _Mapping | None:  # caller holds the lock
        """The extent's mapping, used now, once mapped and scanned (None otherwise); a
        new scan is asked for when its last is older than `limits.mapped_recheck_s`."""
        mapping = self._maps.get(key)
        if mapping is None or mapping.resident is None:
            return None
        if now >= mapping.scanned_at + limits.mapped_recheck_s:
            self._want(key)
        mapping.last_used = now
        return mapping

    def _release(self, mapping: _Mapping) -> None:
        with self._lock:
            mapping.users -= 1
            if mapping.retired and mapping.users == 0:
                self._sweep()

    def _want(self, key, whole_only: bool = False,
              populate: bool = True) -> None:  # caller holds the lock
        if whole_only and key not in self._wanted:
            self._whole_only.add(key)
            if not populate:
                self._unpopulated.add(key)
        elif not whole_only:
            self._whole_only.discard(key)
            self._unpopulated.discard(key)
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
            self._publish(key, None)  # before the epoch moves: no C send begins with it
            mapping.retired = True
            mapping.retired_at = self._epoch
            self._epoch += 1
            self.mapped_bytes -= mapping.size
            self._graveyard.append(mapping)
            self._sweep()

    def _sweep(self) -> None:  # caller holds the lock
        """Unmap the retired mappings no send can be using any more."""
        oldest = min(self._in_flight) if self._in_flight else self._epoch
        kept = []
        for mapping in self._graveyard:
            if mapping.users == 0 and mapping.retired_at < oldest:
                mapping.unmap()
            else:
                kept.append(mapping)
        self._graveyard = kept

    def _publish(self, key, mapping: _Mapping | None,
                 resident: np.ndarray | None = None) -> None:  # caller holds the lock
        """Write the extent's row of its dataset's table: `mapping` with `resident` (its
        newest scan), or zeros (no mapping, or no scan: the C send leaves it alone).
        The row is written before the mapping drops its old scan, so a row never
        names a freed array (the C send reads rows holding the interpreter lock)."""
        dataset_id, extent_no = key
        rows = self._tables.get(dataset_id)
        if mapping is None or resident is None:
            if rows is not None and extent_no < len(rows):
                rows[extent_no] = 0
            return
        if rows is None or extent_no >= len(rows):
            grown = np.zeros((max(extent_no + 1, 2 * (0 if rows is None else len(rows)), 8),
                              TABLE_COLUMNS), dtype=np.uint64)
            if rows is not None:
                grown[:len(rows)] = rows
            self._tables[dataset_id] = rows = grown
        rows[extent_no, :TABLE_USED] = (mapping.address, mapping.size, resident.ctypes.data,
                                        len(resident), _every_page(resident))

    def _harvest(self, now: float) -> None:  # caller holds the lock
        """Take the marks C sends left in the tables: each extent they sent from was used
        now, and is scanned again when its last scan is older than
        `limits.mapped_recheck_s`."""
        for dataset_id, rows in self._tables.items():
            used = np.flatnonzero(rows[:, TABLE_USED])
            if not used.size:
                continue
            rows[used, TABLE_USED] = 0
            for extent_no in used.tolist():
                key = (dataset_id, extent_no)
                mapping = self._maps.get(key)
                if mapping is not None:
                    mapping.last_used = now
                    if now >= mapping.scanned_at + limits.mapped_recheck_s:
                        self._wanted.add(key)

    # --- mappings: the background thread ---------------------------------------------

    def _run(self) -> None:
        """Map and scan what sends asked for; unmap idle mappings (every idle_s / 2, or
        mapped_recheck_s if sooner)."""
        with self._lock:
            while not self._closed:
                if not self._wanted:
                    # Woken at least as often as scans of extents in use fall due.
                    self._wake.wait(min(self._idle_s / 2, limits.mapped_recheck_s))
                self._harvest(self._clock())  # before the idle check below
                wanted, self._wanted = list(self._wanted), set()
                whole_only, self._whole_only = self._whole_only, set()
                unpopulated, self._unpopulated = self._unpopulated, set()
                self._lock.release()
                try:
                    for key in wanted:
                        try:
                            self._map_and_scan(key, key in whole_only,
                                               populate=key not in unpopulated)
                        except Exception as exc:  # a missing or unreadable extent: read path
                            log.debug("extent %s not mapped: %s", key, exc)
                finally:
                    self._lock.acquire()
                now = self._clock()
                for key in [k for k, m in self._maps.items()
                            if m.users == 0 and now - m.last_used >= self._idle_s]:
                    self._retire(key)

    def _map_and_scan(self, key, whole_only: bool = False, populate: bool = True) -> None:
        """Map the extent if it is not (populated when the page cache holds nearly all of
        it and `populate`; not at all otherwise if `whole_only`), then scan which of
        its pages are cached (`mincore`, within the time share).  Runs on the
        background thread."""
        now = self._clock()
        with self._lock:
            if self._closed or not self._spend(now):
                return  # asked again by the next send that wants it
            forgets = self._forgets
            mapping = self._maps.get(key)
            if mapping is not None:
                mapping.users += 1  # not unmapped while scanned
        if mapping is None:
            mapping = self._map(key, now, whole_only, populate)
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
            if not mapping.retired:
                self._publish(key, mapping, resident)
            mapping.resident = resident
            mapping.scanned_at = now

    def _map(self, key, now: float, whole_only: bool = False,
             populate: bool = True) -> _Mapping | None:
        """The extent mapped, or None (then not tried again for a while): when it cannot
        be, or with `whole_only` when the page cache does not hold nearly all of it.
        Its page tables are filled at once if `populate` and it is nearly all cached."""
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
                    mapping = _map(fd, size, now, populate=whole and populate)
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
            self._tables.pop(dataset_id, None)

    def mapped_count(self) -> int:
        with self._lock:
            return len(self._maps)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for key in list(self._maps):
                self._retire(key)
            self._tables.clear()
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


def _every_page(resident: np.ndarray) -> bool:
    """Whether a scan's prefix sum counts every page cached."""
    return int(resident[-1]) == len(resident) - 1


def _extent_numbers(extent: np.ndarray) -> np.ndarray:
    """The distinct extents of the pieces, sorted (one, as a rule: no sort then)."""
    first = extent[:1]
    return first if (extent == first).all() else np.unique(extent)


def _scanned_cached(mappings: list[_Mapping], numbers: np.ndarray, extent: np.ndarray,
                    offset: np.ndarray, size: np.ndarray) -> tuple[np.ndarray | int, bool | None]:
    """(which of `mappings` (those of `numbers`, in order) each piece lies in, whether
    their last scans found every page of the pieces cached); None for the latter
    when a piece lies outside its file as it was mapped (the kernel knows)."""
    if len(mappings) == 1:  # the common case, in fewer array operations
        which = 0
        outside = int(offset.min()) < 0 or int((offset + size).max()) > mappings[0].size
    else:
        which = np.searchsorted(numbers, extent)
        ends = np.array([m.size for m in mappings], dtype=np.int64)[which]
        outside = bool((offset < 0).any() or (offset + size > ends).any())
    if outside:
        return which, None
    # An extent whose last scan found every page cached needs no look per piece.
    return which, all(m.whole for m in mappings) or _all_resident(mappings, which, offset, size)


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
